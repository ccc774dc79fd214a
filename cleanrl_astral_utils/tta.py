"""What tta_gating.py adds to its measurements where this package is installed: the statistics (95% CIs, paired gains over
`none`, the ceiling's headroom, the clamp specificity, the swap effects and the learned gate's routing), their TensorBoard
scalars, eval.json's headline numbers, `--resume` of a stopped `adapt` run, the planned workload, and the plots."""

import copy
import os
import time
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from cleanrl_astral_utils.cartpole import KINDS, mutual_information
from cleanrl_astral_utils.stats import mean_t_ci95

# flags that do not change a single number: a resumed run may differ from the stopped one in these
RESUME_FREE_ARGS = {"resume", "track", "wandb_project_name", "wandb_entity", "runs_dir"}


# STATISTICS
mean_ci = mean_t_ci95  # the mean and its 95% Student-t CI, {"mean", "ci95", "n"} (cleanrl_astral_utils.stats)


# REPORTS
def summarise_target(result):
    """One target's tta.json entry from its per-seed measurements: means and 95% CIs, the ceiling's statistics, the
    gains over `none` paired by seed, and the gain as a fraction of the ceiling's headroom (ceiling − before)."""
    out = {
        "before": {kind: {**mean_ci(v), "per_seed": v} for kind, v in result["before"].items()},
        "ceiling": None,
        "controls": result["controls"],
    }
    if result["ceiling"]:
        per_setting = result["ceiling"]["per_setting"]
        best = result["ceiling"]["best"]
        out["ceiling"] = {"best": best, "sampled": {**mean_ci(per_setting[best]), "per_seed": per_setting[best]}}
        out["ceiling"]["per_setting"] = per_setting
    for entry in out["controls"].values():
        curves = np.asarray(entry["during_per_seed"])
        entry["during"] = {"mean": curves.mean(0).tolist(), "ci95": [mean_ci(c)["ci95"] for c in curves.T]}
        entry["during_mean"] = mean_ci(curves.mean(1))
        entry["after"] = {kind: mean_ci(v) for kind, v in entry["after_per_seed"].items()}
    none = out["controls"].get("none")
    gap = 0.0
    if out["ceiling"]:
        gap = out["ceiling"]["sampled"]["mean"] - out["before"]["sampled"]["mean"]
    for control, entry in out["controls"].items():
        if none is None or control == "none":
            continue
        # paired by seed: the same episodes with and without updates
        gain_during = np.mean(entry["during_per_seed"], 1) - np.mean(none["during_per_seed"], 1)
        gain = mean_ci(np.subtract(entry["after_per_seed"]["sampled"], none["after_per_seed"]["sampled"]))
        entry["gain_over_none"] = {"during_mean": mean_ci(gain_during), "after_sampled": gain}
        # the gap is taken as fixed, so the fraction's CI is the gain's, scaled; without headroom there is no fraction
        entry["gain_fraction_of_ceiling"] = None
        if gap > 0:
            ci95 = None
            if gain["ci95"] is not None:
                ci95 = gain["ci95"] / gap
            entry["gain_fraction_of_ceiling"] = {"mean": gain["mean"] / gap, "ci95": ci95, "gap": gap}
    return out


def adapt_stats(entry):
    """The per-control statistics that TensorBoard and eval.json show, by name (None where there is none)."""
    gains = entry.get("gain_over_none", {})
    return {
        "during_mean": entry["during_mean"],
        "after_deterministic": entry["after"]["deterministic"],
        "after_sampled": entry["after"]["sampled"],
        "gain_over_none_during": gains.get("during_mean"),
        "gain_over_none_after_sampled": gains.get("after_sampled"),
        "gain_fraction_of_ceiling": entry.get("gain_fraction_of_ceiling"),
    }


def log_adapt_target(writer, name, result, episodes):
    """TensorBoard scalars of one finished target: tta/{stat}_{target}[_{control}]."""
    for kind in KINDS:
        writer.add_scalar(f"tta/before_{kind}_{name}", result["before"][kind]["mean"], 0)
    if result["ceiling"]:
        writer.add_scalar(f"tta/ceiling_sampled_{name}", result["ceiling"]["sampled"]["mean"], 0)
    for control, entry in result["controls"].items():
        for step, value in enumerate(entry["during"]["mean"]):
            writer.add_scalar(f"tta/episodic_return_{name}_{control}", value, step + 1)
        for key, stat in adapt_stats(entry).items():
            if stat:
                writer.add_scalar(f"tta/{key}_{name}_{control}", stat["mean"], episodes)


def averaged(summary):
    """{key: [values]} or {key: {column: [values]}} -> the same with each list replaced by its mean."""
    headline = {}
    for key, values in summary.items():
        if isinstance(values, dict):
            headline[key] = {column: float(np.mean(v)) for column, v in values.items()}
        else:
            headline[key] = float(np.mean(values))
    return headline


def adapt_headline(report):
    """eval.json of an adapt run: every statistic averaged over the targets (the fraction over those with headroom)."""
    summary = {}
    for target in report["targets"]:
        result = report["results"][target["name"]]
        for kind in KINDS:
            summary.setdefault(f"before_{kind}", []).append(result["before"][kind]["mean"])
        if result["ceiling"]:
            summary.setdefault("ceiling_sampled", []).append(result["ceiling"]["sampled"]["mean"])
        for control, entry in result["controls"].items():
            for key, stat in adapt_stats(entry).items():
                if stat:
                    summary.setdefault(key, {}).setdefault(control, []).append(stat["mean"])
    return averaged(summary)


def return_matrix(results, targets, columns):
    """{kind: target × column array of mean returns}."""
    return {kind: np.array([[results[t["name"]][c][kind]["mean"] for c in columns] for t in targets]) for kind in KINDS}


# ANALYSIS: clamp specificity, swap effects, the learned gate's routing
def clamp_specificity(returns):
    """Mode × slot return matrix -> (mean matched cell − mean other cell of the matched rows and columns, [(row, column)]).
    Slots are unlabelled: each mode is matched to a slot of its own (Hungarian, maximising the matched returns). A mode or
    slot better everywhere cancels out; the maximising match makes the score ≥ 0 even for noise. None below two pairs."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(returns, maximize=True)
    matched = np.asarray(returns)[np.ix_(rows, cols)]
    score = None
    if len(rows) > 1:
        score = float(np.diag(matched).mean() - matched[~np.eye(len(rows), dtype=bool)].mean())
    return score, [(int(r), int(c)) for r, c in zip(rows, cols)]


def sign_name(sign):
    return f"sign{sign:+g}"


def swap_effect(matrix, targets, columns):
    """From the target × gate return matrix: per training mode, own group's gate − the other group's gate, by sign
    (`sign+1` vs `sign-1`) and by mode (own mode's gate − the mean of the other training modes' gates); averaged over the
    training modes. None where a grouping has no other group."""
    training = [i for i, t in enumerate(targets) if not t["held_out"]]
    col = {name: j for j, name in enumerate(columns)}
    by_sign = {}
    by_mode = {}
    for i in training:
        target = targets[i]
        own_sign = sign_name(target["physics"][2])
        other_signs = [c for c in columns if c.startswith("sign") and c != own_sign]
        if other_signs:
            by_sign[target["name"]] = float(matrix[i, col[own_sign]] - np.mean([matrix[i, col[c]] for c in other_signs]))
        others = [targets[k]["name"] for k in training if k != i]
        if others:
            by_mode[target["name"]] = float(matrix[i, col[target["name"]]] - np.mean([matrix[i, col[c]] for c in others]))
    result = {}
    for grouping, per_mode in (("sign", by_sign), ("mode", by_mode)):
        value = None
        if per_mode:
            value = float(np.mean(list(per_mode.values())))
        result[grouping] = {"value": value, "per_mode": per_mode}
    return result


def episode_nmi(labels, slots, num_slots):
    """Episode-level NMI: one sample per episode, its label against the argmax slot of its mean gate, I / H(label)."""
    values = sorted(set(labels))
    counts = np.zeros((len(values), num_slots))
    for label, slot in zip(labels, slots):
        counts[values.index(label), slot] += 1
    return mutual_information(counts)[1]


def gate_routing(episode_gates, mean_gates, targets):
    """What the learned gate says about the modes: episode-level NMI of the argmax of each episode's mean gate against
    the mode and against the force sign (training modes), each mode's argmax slot, whether the two signs' training modes
    use disjoint sets of slots (and one slot each: an exact sign split), and where each held-out mode goes: its argmax
    slot, whether that is one of its sign's slots (only where the signs' slots are disjoint), and the share of its
    episodes on its sign's slots."""
    training = [t for t in targets if not t["held_out"]]
    num_slots = len(next(iter(mean_gates.values())))
    modes = []
    signs = []
    slots = []
    for t in training:
        episode_slots = np.asarray(episode_gates[t["name"]]).argmax(-1).tolist()
        slots += episode_slots
        modes += [t["name"]] * len(episode_slots)
        signs += [t["physics"][2]] * len(episode_slots)
    slot_of_mode = {t["name"]: int(np.argmax(mean_gates[t["name"]])) for t in targets}
    sign_slots = {}
    for t in training:
        sign_slots.setdefault(t["physics"][2], set()).add(slot_of_mode[t["name"]])
    used = [slot for slots_of_sign in sign_slots.values() for slot in slots_of_sign]
    disjoint = len(sign_slots) > 1 and len(used) == len(set(used))
    one_each = disjoint and all(len(slots_of_sign) == 1 for slots_of_sign in sign_slots.values())
    held_out = {}
    for t in targets:
        if not t["held_out"]:
            continue
        sign = t["physics"][2]
        entry = {"sign": sign, "slot": slot_of_mode[t["name"]], "sign_slots": None, "to_sign_slot": None}
        if disjoint and sign in sign_slots:
            episode_slots = np.asarray(episode_gates[t["name"]]).argmax(-1)
            entry["sign_slots"] = sorted(sign_slots[sign])
            entry["to_sign_slot"] = entry["slot"] in sign_slots[sign]
            entry["episode_share_on_sign_slots"] = float(np.isin(episode_slots, entry["sign_slots"]).mean())
        held_out[t["name"]] = entry
    return {
        "episode_nmi_mode": episode_nmi(modes, slots, num_slots),
        "episode_nmi_sign": episode_nmi(signs, slots, num_slots),
        "episodes": len(slots),
        "slot_of_mode": slot_of_mode,
        "signs_on_disjoint_slots": disjoint,
        "sign_split": one_each,
        "held_out": held_out,
    }


def add_clamp_analysis(report, targets, num_slots):
    """Adds to clamp.json's `report` (its columns and each target's cells) the target × column return matrix and the clamp
    specificity of its slot columns."""
    matrix = return_matrix(report["results"], targets, report["columns"])
    report["matrix"] = {kind: m.tolist() for kind, m in matrix.items()}
    report["specificity"] = {}
    for kind in KINDS:
        score, matching = clamp_specificity(matrix[kind][:, :num_slots])
        pairs = [[targets[r]["name"], f"slot{c}"] for r, c in matching]
        report["specificity"][kind] = {"score": score, "matching": pairs}
    return report


def add_swap_analysis(report, targets):
    """Adds to swap.json's `report` (its columns, the learned gate's routing and each target's cells) the target × column
    return matrix and the swap effects."""
    matrix = return_matrix(report["results"], targets, report["columns"])
    report["matrix"] = {kind: m.tolist() for kind, m in matrix.items()}
    report["swap_effect"] = {kind: swap_effect(matrix[kind], targets, report["columns"]) for kind in KINDS}
    return report


def log_clamp_specificity(writer, report):
    """TensorBoard tta/clamp_specificity_{kind} and one printed line per kind."""
    for kind in KINDS:
        specificity = report["specificity"][kind]
        if specificity["score"] is not None:
            writer.add_scalar(f"tta/clamp_specificity_{kind}", specificity["score"], 0)
        print(f"clamp specificity, {kind}: {specificity['score']}, matching {specificity['matching']}")


def log_swap(writer, report):
    """TensorBoard scalars of a swap report's effects and of the learned gate's routing."""
    for kind in KINDS:
        for grouping, effect in report["swap_effect"][kind].items():
            if effect["value"] is not None:
                writer.add_scalar(f"tta/swap_effect_{grouping}_{kind}", effect["value"], 0)
    routing = report["routing"]
    writer.add_scalar("tta/gate_episode_nmi_mode", routing["episode_nmi_mode"], 0)
    writer.add_scalar("tta/gate_episode_nmi_sign", routing["episode_nmi_sign"], 0)
    for name, entry in routing["held_out"].items():
        if entry["to_sign_slot"] is not None:
            writer.add_scalar(f"tta/held_out_to_sign_slot_{name}", float(entry["to_sign_slot"]), 0)


def clamp_headline(report):
    """eval.json of a clamp run: uniform and learned averaged over the targets (slot k of one checkpoint is not slot k of
    another: no pooling), and the specificity."""
    summary = {}
    for target in report["targets"]:
        result = report["results"][target["name"]]
        for column in report["columns"]:
            if column.startswith("slot"):
                continue
            for kind in KINDS:
                summary.setdefault(f"clamp_{kind}", {}).setdefault(column, []).append(result[column][kind]["mean"])
    for kind in KINDS:
        score = report["specificity"][kind]["score"]
        if score is not None:
            summary.setdefault("clamp_specificity", {})[kind] = [score]
    return averaged(summary)


def swap_headline(report):
    """eval.json of a swap run: the swap effects, the learned gate's episode-level NMIs, the sign split and the share of
    held-out modes routed to their sign's slot."""
    headline = {}
    for grouping in ("sign", "mode"):
        for kind in KINDS:
            value = report["swap_effect"][kind][grouping]["value"]
            if value is not None:
                headline.setdefault(f"swap_effect_{grouping}", {})[kind] = value
    routing = report["routing"]
    headline["gate_episode_nmi_mode"] = routing["episode_nmi_mode"]
    headline["gate_episode_nmi_sign"] = routing["episode_nmi_sign"]
    headline["signs_on_disjoint_slots"] = float(routing["signs_on_disjoint_slots"])
    headline["sign_split"] = float(routing["sign_split"])
    routed = [entry["to_sign_slot"] for entry in routing["held_out"].values() if entry["to_sign_slot"] is not None]
    if routed:
        headline["held_out_to_sign_slot"] = float(np.mean(routed))
    return headline


def describe_swap(report):
    """The lines a swap run prints at its end."""
    routing = report["routing"]
    lines = [
        f"mean learned gates: {', '.join(f'{k} {np.round(w, 2).tolist()}' for k, w in report['mean_gates'].items())}",
        f"argmax slot per mode {routing['slot_of_mode']}; the signs' training modes on disjoint slots: "
        f"{routing['signs_on_disjoint_slots']}, one slot per sign: {routing['sign_split']}",
        f"episode-level NMI of the argmax slot ({routing['episodes']} episodes of the training modes): "
        f"against the mode {routing['episode_nmi_mode']:.3f}, against the force sign {routing['episode_nmi_sign']:.3f}",
    ]
    for name, entry in routing["held_out"].items():
        lines.append(
            f"held-out {name} (force sign {entry['sign']:+g}): slot {entry['slot']}, its sign's slots {entry['sign_slots']}"
        )
    for kind in KINDS:
        effects = report["swap_effect"][kind]
        lines.append(
            f"swap effect ({kind}): own sign's gate − other sign's {effects['sign']['value']}, "
            f"own mode's gate − other modes' {effects['mode']['value']}"
        )
    return "\n".join(lines)


# RESUMING
def resumed_report(run_dir, report):
    """The tta.json of the stopped run in `run_dir`, its finished targets kept, if it was run with the same flags and
    checkpoint as `report` (the new run's); ValueError otherwise."""
    import json

    with open(os.path.join(run_dir, "tta.json")) as f:
        stopped = json.load(f)
    if stopped.get("subcommand") != "adapt":
        raise ValueError(f"--resume {run_dir!r} holds no adapt run")
    if stopped["checkpoint"] != report["checkpoint"]:
        raise ValueError(f"--resume {run_dir!r} adapted {stopped['checkpoint']}, not {report['checkpoint']}")
    for name, value in report["args"].items():
        if name in RESUME_FREE_ARGS or stopped["args"].get(name) == value:
            continue
        flag = "--" + name.replace("_", "-")
        raise ValueError(
            f"--resume {run_dir!r} was run with {flag} {stopped['args'].get(name)}, not {value}; pass the same flags"
        )
    stopped.setdefault("results", {})
    return stopped


def saved_adapted(path, save_model):
    """The adapted agents a stopped run already saved to `path` (none without --save-model or file)."""
    if not save_model or not os.path.isfile(path):
        return []
    return torch.load(path, map_location="cpu", weights_only=True)["adapted"]


# WORKLOAD
class Workload(NamedTuple):
    targets: int
    """targets left to run"""
    adaptation_episodes: int
    """targets × controls × seeds × episodes, one env each"""
    evaluations: int
    """batched evaluations of --eval-episodes envs: before, ceiling gates, after"""
    eval_episodes: int
    """envs per evaluation"""


def adapt_workload(args, num_targets, num_ceiling_settings):
    """What an adapt run plays: per target, `before` (each seed, both kinds), every ceiling gate (each seed, sampled),
    and per control and seed the adaptation episodes and `after` (both kinds)."""
    per_target_evaluations = args.num_seeds * (2 + num_ceiling_settings + 2 * len(args.controls))
    return Workload(
        num_targets,
        num_targets * len(args.controls) * args.num_seeds * args.episodes,
        num_targets * per_target_evaluations,
        args.eval_episodes,
    )


def seconds_per_step(agent, policy_step, hide_velocity, batch, backward):
    """Wall-clock seconds of one acting step (tta_gating.py's `policy_step`) of `batch` envs (with `backward`, its share
    of a backward pass), timed on 64 steps of zero inputs by a copy of the agent: the basis of the time estimate."""
    agent = copy.deepcopy(agent)
    obs = np.zeros((batch, 2 if hide_velocity else 4), np.float32)
    state = torch.zeros(batch, agent.hidden_size)
    none = np.full(batch, -1)
    zeros = np.zeros(batch)
    starts = np.ones(batch)
    logprobs = []
    begin = time.perf_counter()
    with torch.set_grad_enabled(backward):
        for _ in range(64):
            step = policy_step(agent, obs, none, zeros, zeros, state, starts)
            state = step.state
            logprobs.append(step.dist.log_prob(torch.zeros(batch, dtype=torch.long)))
        if backward:
            torch.cat(logprobs).sum().backward()
    return (time.perf_counter() - begin) / 64


def describe_workload(workload, agent, policy_step, hide_velocity, results_path, run_dir):
    """The plan printed at start: how much is played, and the time it takes at most (every episode 500 steps long), an
    adaptation step and an evaluation step of `agent` timed now (seconds_per_step)."""
    adapt_step = seconds_per_step(agent, policy_step, hide_velocity, 1, backward=True)
    eval_step = seconds_per_step(agent, policy_step, hide_velocity, workload.eval_episodes, backward=False)
    longest = workload.adaptation_episodes * 500 * adapt_step + workload.evaluations * 500 * eval_step
    return (
        f"planned: {workload.targets} targets, {workload.adaptation_episodes} adaptation episodes and "
        f"{workload.evaluations} evaluations of {workload.eval_episodes} episodes; at most {longest / 60:.1f} min here "
        f"if every episode lasts 500 steps ({adapt_step * 1e3:.2f} ms per adaptation step, {eval_step * 1e3:.2f} ms per "
        f"evaluation step, timed now). Each finished target is written to {results_path}; "
        f"a stopped run continues with the same flags and --resume {run_dir}"
    )


# PLOTS
def plot_adaptation_curves(results, targets, controls, path, title):
    """One panel per target: each control's mean return per adaptation episode, its 95% CI; before dotted, ceiling dashed."""
    ncols = min(3, len(targets))
    nrows = (len(targets) + 2) // 3
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(6.0, 4.2 * ncols), 3.2 * nrows + 0.6), squeeze=False, layout="constrained"
    )
    colors = {"none": "tab:gray", "gate": "tab:blue", "context": "tab:purple", "all": "tab:orange", "tent": "tab:green"}
    for ax, target in zip(axes.flat, targets):
        res = results[target["name"]]
        for control in controls:
            during = res["controls"][control]["during"]
            x = np.arange(1, len(during["mean"]) + 1)
            mean = np.asarray(during["mean"])
            ax.plot(x, mean, label=control, color=colors[control])
            if during["ci95"][0] is not None:
                ax.fill_between(x, mean - during["ci95"], mean + during["ci95"], alpha=0.15, color=colors[control])
        ax.axhline(res["before"]["sampled"]["mean"], color="black", linestyle=":", linewidth=1, label="before (eval)")
        if res["ceiling"]:
            ax.axhline(res["ceiling"]["sampled"]["mean"], color="black", linestyle="--", linewidth=1, label="ceiling (eval)")
        ax.set(xlabel="adaptation episode", ylabel="return", ylim=(0, None))
        ax.set_title(target["label"], fontsize=9)
    for ax in list(axes.flat)[len(targets) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_heatmap(matrix, row_labels, col_labels, path, title):
    """Annotated target × gate-setting heatmaps of mean return, one panel per action kind."""
    fig, axes = plt.subplots(
        1,
        len(matrix),
        figsize=(3.0 + 0.9 * len(col_labels) * len(matrix), 1.6 + 0.5 * len(row_labels)),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, (kind, values) in zip(axes[0], matrix.items()):
        im = ax.imshow(np.asarray(values), cmap="viridis", vmin=0.0, vmax=500.0, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            color = "black"
            if v < 300:
                color = "white"
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", color=color, fontsize=8)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=30, fontsize=8)
        ax.set_title(f"{kind} actions", fontsize=9)
    axes[0][0].set_yticks(range(len(row_labels)), row_labels, fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03, pad=0.02, label="return")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
