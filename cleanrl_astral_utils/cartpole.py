"""What the CartPole training scripts (ppo_gru_baseline.py, ppo_gru_astral.py) do around their method: the evaluation's
analysis (the gate per mode, linear probes, the held-out modes' routing), the post-training evaluation report (eval.json,
its TensorBoard scalars and printed lines), the slot heatmap and the evaluation videos.

The scripts import it only where a run asks for it (the report after --save-model, evaluate(), --capture-video), as
CleanRL imports cleanrl_utils; without it they still train and save their checkpoints."""

import os
from typing import NamedTuple

import numpy as np

from cleanrl_astral_utils.files import atomic_write_json

KINDS = ("deterministic", "sampled")  # the evaluation's actions: the policy's argmax, and draws from it
PROBE_BURN_IN = 10  # the steps an episode's memory may take to infer the mode: probes skip them, as ASTRAL's metrics do


# EVALUATION REPORT
def returns_report(script, model_path, episodes_per_mode, modes, held_out, returns_by_kind):
    """eval.json's returns: per mode and kind (deterministic, sampled) the mean, std and every return; per kind the mean
    over the training modes (`{kind}_mean`) and, apart, over the held-out modes (`{kind}_held_out_mean`)."""
    report = {
        "script": script,
        "checkpoint": model_path,
        "episodes_per_mode": episodes_per_mode,
        "held_out_modes": held_out,
        "modes": [{"gravity": gravity, "half_length": length, "force_sign": sign} for gravity, length, sign in modes],
        "per_mode": {},
    }
    for kind, returns in returns_by_kind.items():
        for k, mode_returns in returns.items():
            entry = {
                "mean": float(np.mean(mode_returns)),
                "std": float(np.std(mode_returns)),
                "returns": mode_returns.tolist(),
            }
            report["per_mode"].setdefault(str(k), {})[kind] = entry
        training = [k for k in returns if k not in held_out]
        report[f"{kind}_mean"] = float(np.mean([np.mean(returns[k]) for k in training]))
        if held_out:
            report[f"{kind}_held_out_mean"] = float(np.mean([np.mean(returns[k]) for k in held_out]))
    return report


def log_report(writer, report, global_step):
    """TensorBoard eval/episodic_return_mode{k}_{kind}, and slots/eval_{metric}_{kind} for each slot or probe metric."""
    for k, per_kind in report["per_mode"].items():
        for kind, entry in per_kind.items():
            writer.add_scalar(f"eval/episodic_return_mode{k}_{kind}", entry["mean"], global_step)
    for kind in KINDS:
        for key, value in report.get(f"slots_{kind}", {}).items():
            writer.add_scalar(f"slots/eval_{key}_{kind}", value, global_step)
    for kind in KINDS:
        for key, value in report.get(f"probes_{kind}", {}).items():
            writer.add_scalar(f"eval/{key}_{kind}", value, global_step)


def print_returns(report):
    """One line per mode: `eval mode k (n episodes): deterministic mean ± std, sampled mean ± std`."""
    for k, per_kind in report["per_mode"].items():
        parts = [f"{kind} {entry['mean']:.1f} ± {entry['std']:.1f}" for kind, entry in per_kind.items()]
        print(f"eval mode {k} ({report['episodes_per_mode']} episodes): " + ", ".join(parts))


def print_probes(report):
    """The GRU baseline's probe line: how well a linear probe reads the preset's action latent from h, per kind."""
    latent = report["action_latent"]
    if latent is None:
        print("linear probe of the action latent from h: none (no mode of this preset changes which action is right)")
        return
    parts = [f"{kind} {report[f'probes_{kind}'][f'probe_acc_h_{latent}']:.3f}" for kind in KINDS]
    print(f"linear probe of the {latent.replace('_', ' ')} from h (held-out episodes' accuracy): " + ", ".join(parts))


def add_slot_report(report, evaluations):
    """ASTRAL's slot figures per kind into eval.json: the mode x slot mean gate weights, the step-level MI and NMI, the
    episode-level metrics and probes, and the held-out modes' routing; and the preset's action latent."""
    for kind, evaluation in evaluations.items():
        report[f"slot_weights_{kind}"] = evaluation["slot_weights"].tolist()
        report[f"mode_slot_mi_{kind}"] = evaluation["mode_slot_mi"]
        report[f"mode_slot_nmi_{kind}"] = evaluation["mode_slot_nmi"]
        report[f"slots_{kind}"] = evaluation["slots"]
        report[f"held_out_routing_{kind}"] = evaluation["held_out_routing"]
        report["action_latent"] = evaluation["action_latent"]


def slot_summary_parts(report, kind="deterministic"):
    """The slot figures of one evaluation kind: episode-level NMI and linear probes against the mode and the action
    latent, and each held-out mode's slot (see slot_summary)."""
    slots = report[f"slots_{kind}"]
    latent = report["action_latent"]
    nmi = f"episode NMI vs mode {slots['episode_nmi']:.3f}"
    probe_h = f"probe from h vs mode {slots['probe_acc_h']:.3f}"
    probe_w = f"probe from w vs mode {slots['probe_acc_w']:.3f}"
    if latent is None:
        return [nmi, probe_h, probe_w, "no action latent: every mode of this preset pushes alike"]
    name = latent.replace("_", " ")
    nmi += f", vs {name} {slots[f'episode_nmi_{latent}']:.3f}"
    probe_h += f", vs {name} {slots[f'probe_acc_h_{latent}']:.3f}"
    probe_w += f", vs {name} {slots[f'probe_acc_w_{latent}']:.3f}"
    parts = [nmi, probe_h, probe_w]
    for route in report[f"held_out_routing_{kind}"]:
        parts.append(f"held-out mode {route['mode']} -> slot {route['slot']} ({route['verdict']})")
    return parts


def slot_summary(report, kind="deterministic"):
    """`episode NMI vs mode 0.500, vs force sign 1.000; probe from h vs mode ..., vs force sign ...; ...; held-out mode
    4 -> slot 2 (its sign's slot)`."""
    return "; ".join(slot_summary_parts(report, kind))


def heatmap_title(run_name, report):
    lines = [run_name, "mean gate weight per mode (deterministic evaluation)", *slot_summary_parts(report)]
    return "\n".join(lines)


def print_slot_summary(report):
    """The mean gate weights per mode, then (last line of the run) the slot figures of the deterministic evaluation."""
    weights = np.round(report["slot_weights_deterministic"], 2).tolist()
    print(
        f"deterministic evaluation: mean gate weights per mode {weights}, step NMI {report['mode_slot_nmi_deterministic']:.3f}"
    )
    print(f"deterministic evaluation: {slot_summary(report)}")


def env_report(script, model_path, env_id, episodes, returns_by_kind, mmer):
    """eval.json of an env without modes: per kind (deterministic, sampled) the mean, std and every return of `episodes`
    episodes, and the run's MMER."""
    report = {"script": script, "checkpoint": model_path, "env_id": env_id, "episodes": episodes, "mmer": mmer}
    for kind, returns in returns_by_kind.items():
        report[kind] = {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "returns": returns.tolist()}
    return report


def log_env_report(writer, report, global_step):
    """TensorBoard eval/episodic_return_{kind} and one printed line per kind of an env_report."""
    for kind in ("deterministic", "sampled"):
        entry = report[kind]
        writer.add_scalar(f"eval/episodic_return_{kind}", entry["mean"], global_step)
        print(f"eval {report['env_id']} ({report['episodes']} episodes): {kind} {entry['mean']:.3f} ± {entry['std']:.3f}")


class Run(NamedTuple):
    """What a training run hands to its evaluation report."""

    script: str
    args: object
    """the run's Args"""
    modes: list
    """the trained physics modes ([] for an env without modes)"""
    held_out: list
    run_name: str
    run_dir: str
    writer: object
    global_step: int
    mmer: float
    """the run's MMER (charts/mmer), reported for an env without modes"""


def report_evaluation(run, evaluate, model_path, action_latent=None, device="cpu"):
    """A --save-model run's evaluation: the saved agent played by the script's `evaluate` for each kind (deterministic,
    sampled) on seed + 100000, the deterministic one filmed with --capture-video, then eval.json, its TensorBoard scalars
    and printed lines; ASTRAL's slot figures and heatmap where the evaluation has them, the GRU baseline's probe line
    (with `action_latent`, the preset's) where it does not."""
    args = run.args
    evaluations = {}
    for kind in KINDS:
        video_dir = None
        if kind == "deterministic" and args.capture_video:
            video_dir = os.path.join(run.run_dir, "videos")
        evaluations[kind] = evaluate(
            model_path,
            args.eval_episodes,
            deterministic=kind == "deterministic",
            seed=args.seed + 100_000,
            video_dir=video_dir,
            device=device,
        )
    if not run.modes:  # another --env-id: no mode
        returns_by_kind = {kind: evaluation["returns"][0] for kind, evaluation in evaluations.items()}
        report = env_report(run.script, model_path, args.env_id, args.eval_episodes, returns_by_kind, run.mmer)
        log_env_report(run.writer, report, run.global_step)
        write_eval_json(report, run.run_dir)
        return
    returns_by_kind = {kind: evaluation["returns"] for kind, evaluation in evaluations.items()}
    report = returns_report(run.script, model_path, args.eval_episodes, run.modes, run.held_out, returns_by_kind)
    slots = "slot_weights" in evaluations["deterministic"]
    if slots:
        add_slot_report(report, evaluations)
        report["slot_heatmap"] = os.path.join(run.run_dir, "slot_heatmap.png")
        plot_slot_heatmap(
            np.array(report["slot_weights_deterministic"]),
            report["slot_heatmap"],
            heatmap_title(run.run_name, report),
            run.modes,
            run.held_out,
        )
    else:
        report["action_latent"] = action_latent
        for kind, evaluation in evaluations.items():
            report[f"probes_{kind}"] = evaluation["probes"]
    log_report(run.writer, report, run.global_step)
    print_returns(report)
    if slots:
        print_slot_summary(report)
    else:
        print_probes(report)
    write_eval_json(report, run.run_dir)


def write_eval_json(report, run_dir):
    """run_dir/eval.json, atomically."""
    atomic_write_json(report, os.path.join(run_dir, "eval.json"), indent=1)


# EVALUATION ANALYSIS: the agent's state and gate against the true mode and the action latent, which it never sees
def mutual_information(counts):
    """I(mode; slot) in nats from a joint count matrix, and the same divided by H(mode) (0 if H(mode) = 0)."""
    joint = counts / counts.sum()
    p_mode = joint.sum(1, keepdims=True)
    p_slot = joint.sum(0, keepdims=True)
    nz = joint > 0
    mi = float((joint[nz] * np.log(joint[nz] / (p_mode @ p_slot)[nz])).sum())
    h_mode = float(-(p_mode[p_mode > 0] * np.log(p_mode[p_mode > 0])).sum())
    if h_mode == 0:
        return mi, 0.0
    return mi, mi / h_mode


class GateByMode(NamedTuple):
    slot_weights: np.ndarray
    """(modes, K) mean gate weights"""
    slot_counts: np.ndarray
    """(modes, K) how often each slot had the largest weight"""
    mode_slot_mi: float
    """step-level I(mode; argmax slot) over the modes not held out"""
    mode_slot_nmi: float


def gate_by_mode(weights, num_slots, held_out):
    """The gate of each mode's evaluation steps (a list of (steps, K) arrays, one per mode) summed up per mode."""
    slot_weights = np.stack([w.mean(0) for w in weights])
    slot_counts = np.stack([np.bincount(w.argmax(-1), minlength=num_slots) for w in weights])
    mode_slot_mi, mode_slot_nmi = mutual_information(np.delete(slot_counts, held_out, 0))
    return GateByMode(slot_weights, slot_counts, mode_slot_mi, mode_slot_nmi)


def probe_accuracies(features, step_modes, episode, latent=None, labels=None):
    """{probe_acc_{name}: a linear probe's accuracy reading the mode from each of `features` ({name: (steps, C)}), and,
    given the action latent's name and each mode's label, probe_acc_{name}_{latent} reading the label}."""
    probes = {}
    for name, x in features.items():
        probes[f"probe_acc_{name}"] = linear_probe_accuracy(x, step_modes, episode)
    if latent is not None:
        for name, x in features.items():
            probes[f"probe_acc_{name}_{latent}"] = linear_probe_accuracy(x, labels[step_modes], episode)
    return probes


def hidden_state_probe(hidden, labels, held_out, episodes_per_mode):
    """The GRU baseline's probe: held-out accuracy of a linear probe reading each trained mode's label from h, past
    burn-in. `hidden[k]` holds mode k's evaluation ({"hidden": (T, N, H), "ages": (T, N)}, env i's first episode)."""
    features = []
    targets = []
    episode = []
    for k in hidden:
        if k in held_out:
            continue
        # the first episode of env i of mode k is episode k * episodes_per_mode + i: even ones fit, odd ones score
        steps, env_index = np.nonzero(hidden[k]["ages"] >= PROBE_BURN_IN)
        features.append(hidden[k]["hidden"][steps, env_index])
        targets.append(np.full(len(steps), labels[k]))
        episode.append(k * episodes_per_mode + env_index)
    return linear_probe_accuracy(np.concatenate(features), np.concatenate(targets), np.concatenate(episode))


def held_out_routing(slot_weights, labels, held_out):
    """Where each held-out mode's gate goes (the argmax of its mean gate weights) beside the slots the training modes of
    its action-latent label (its force sign) go to and those of the other label: [{"mode", "slot", "sign_slots",
    "other_sign_slots", "verdict"}]."""
    slot_of_mode = slot_weights.argmax(-1)
    training = [k for k in range(len(slot_weights)) if k not in held_out]
    routing = []
    for k in held_out:
        slot = int(slot_of_mode[k])
        own = sorted({int(slot_of_mode[j]) for j in training if labels[j] == labels[k]})
        other = sorted({int(slot_of_mode[j]) for j in training if labels[j] != labels[k]})
        if slot in own and slot not in other:
            verdict = "its sign's slot"
        elif slot in own:
            verdict = "a slot both signs use"
        elif slot in other:
            verdict = "the other sign's slot"
        else:
            verdict = "a slot no training mode uses"
        routing.append({"mode": k, "slot": slot, "sign_slots": own, "other_sign_slots": other, "verdict": verdict})
    return routing


def linear_probe_accuracy(features, labels, episode):
    """Held-out accuracy of a logistic regression predicting `labels` from per-step features: fitted on the steps of
    even-numbered episodes, scored on the odd ones' (at most ~10k steps each; nan without two labels to tell apart)."""
    from sklearn.linear_model import LogisticRegression

    fit = episode % 2 == 0
    if len(np.unique(labels[fit])) < 2 or fit.all():
        return float("nan")
    stride = max(1, len(labels) // 20000)
    train = np.flatnonzero(fit)[::stride]
    test = np.flatnonzero(~fit)[::stride]
    probe = LogisticRegression(max_iter=1000).fit(features[train], labels[train])
    return float(probe.score(features[test], labels[test]))


# PLOTS AND VIDEO
def mode_label(k, mode, held_out):
    """A heatmap row's label: the mode's index, physics and force sign, and whether training never saw it."""
    gravity, half_length, sign = mode
    label = f"{k}: g {gravity:g}, l {half_length:g}, force {'+' if sign > 0 else '-'}1"
    if k in held_out:
        label += " (held out)"
    return label


def plot_slot_heatmap(slot_weights, path, title, modes, held_out):
    """Annotated mode x slot heatmap of mean gate weights, saved as PNG; each row labelled with its physics and force
    sign, held-out rows marked."""
    import matplotlib.pyplot as plt

    num_modes, num_slots = slot_weights.shape
    fig, ax = plt.subplots(figsize=(max(5.0, 3.4 + 0.9 * num_slots), 1.4 + 0.6 * num_modes), layout="tight")
    fig.colorbar(ax.imshow(slot_weights, cmap="viridis", vmin=0.0, vmax=1.0), ax=ax, fraction=0.046, pad=0.04)
    for (i, j), v in np.ndenumerate(slot_weights):
        color = "black"
        if v < 0.6:
            color = "white"
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", color=color, fontsize=9)
    labels = [mode_label(k, mode, held_out) for k, mode in enumerate(modes)]
    ax.set(xlabel="slot", ylabel="mode", xticks=range(num_slots), yticks=range(num_modes))
    ax.set_yticklabels(labels, fontsize=8)
    for k in held_out:
        ax.get_yticklabels()[k].set_fontweight("bold")
    ax.set_title(title, fontsize=7)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def record_video(env, play, video_dir, name):
    """One episode of the single env `env`, drawn by gymnasium's CartPole renderer into video_dir/{name}-episode-0.mp4;
    `play(before_step)` resets the env, plays its first episode and calls before_step() before every step."""
    import gymnasium as gym
    from gymnasium.utils.save_video import save_video

    renderer = gym.make("CartPole-v1", render_mode="rgb_array").unwrapped
    frames = []

    def draw():
        renderer.length = env.half_length[env.mode[0]]
        renderer.state = env.state[0]
        frames.append(renderer.render())

    play(draw)
    renderer.state = env.last_state[0]  # the episode's last state: env.state already holds the next episode's first
    frames.append(renderer.render())
    save_video(frames, video_dir, fps=50, name_prefix=name)
