"""Tests for cleanrl_astral_utils/tta.py, tta_gating.py's reports and analysis: the statistics, the paired gains and the
ceiling's headroom, the clamp specificity, the learned gate's routing and episode NMI, and the heatmap's orientation."""

import numpy as np
import pytest

import cleanrl_astral.tta_gating as tta_gating
from cleanrl_astral_utils import tta


def test_mean_ci_is_the_student_t_interval_of_the_mean():
    """half-width t_{0.975, n-1} s / sqrt(n), s with ddof=1; with ddof=0 or n degrees of freedom every CI were too narrow."""
    stat = tta.mean_ci([1.0, 2.0, 3.0, 4.0])
    assert stat["mean"] == 2.5
    assert stat["n"] == 4
    assert stat["ci95"] == pytest.approx(3.182446305284263 * np.sqrt(5 / 3) / 2, rel=1e-9)
    assert tta.mean_ci([7.0]) == {"mean": 7.0, "ci95": None, "n": 1}


def measured(ceiling_best):
    """A target's planted measurements: before 10 / 20 on the two seeds, the fixed gates slot0 30 / 40 and slot1 5 / 5,
    `none` after 10 / 20 and `gate` after 25 / 27 (sampled), with `ceiling_best` as the ceiling."""
    controls = {}
    for control, after in (("none", [10.0, 20.0]), ("gate", [25.0, 27.0])):
        entry = tta_gating.new_control_entry()
        entry["after_per_seed"] = {"deterministic": [0.0, 0.0], "sampled": after}
        entry["during_per_seed"] = [[1.0, 3.0], [2.0, 2.0]]
        if control == "gate":
            entry["during_per_seed"] = [[5.0, 7.0], [2.0, 4.0]]
        controls[control] = entry
    return {
        "before": {"deterministic": [10.0, 20.0], "sampled": [10.0, 20.0]},
        "ceiling": {"best": ceiling_best, "per_setting": {"slot0": [30.0, 40.0], "slot1": [5.0, 5.0]}},
        "controls": controls,
    }


def test_summarised_gains_are_paired_and_divided_by_the_ceilings_headroom():
    """The paired gains are 15 / 7, the headroom 35 - 15 = 20 and the fraction 11 / 20. If this failed, the gain were
    unpaired, the ceiling another setting, or the fraction of another gap."""
    res = tta.summarise_target(measured("slot0"))
    assert res["before"]["sampled"]["per_seed"] == [10.0, 20.0]
    assert res["ceiling"]["best"] == "slot0"
    assert res["ceiling"]["sampled"]["mean"] == 35.0
    gain = res["controls"]["gate"]["gain_over_none"]["after_sampled"]
    assert gain == tta.mean_ci([15.0, 7.0])
    assert res["controls"]["gate"]["gain_over_none"]["during_mean"] == tta.mean_ci([4.0, 1.0])
    fraction = res["controls"]["gate"]["gain_fraction_of_ceiling"]
    assert fraction == {"mean": 11.0 / 20.0, "ci95": gain["ci95"] / 20.0, "gap": 20.0}
    assert "gain_over_none" not in res["controls"]["none"]


def test_a_ceiling_without_headroom_gives_no_fraction():
    res = tta.summarise_target(measured("slot1"))
    assert res["ceiling"]["best"] == "slot1"
    assert res["controls"]["gate"]["gain_fraction_of_ceiling"] is None


def test_clamp_specificity_matches_slots_to_modes_and_ignores_mode_and_slot_effects():
    planted = np.full((3, 3), 100.0)
    planted[[0, 1, 2], [2, 0, 1]] = 400.0  # mode i is served by slot (i + 2) mod 3
    assert tta.clamp_specificity(planted) == (300.0, [(0, 2), (1, 0), (2, 1)])
    additive = np.array([10.0, 200.0, 30.0])[:, None] + np.array([0.0, 50.0, 7.0])[None, :]  # harder modes, better slots
    assert tta.clamp_specificity(additive)[0] == pytest.approx(0.0, abs=1e-9)
    # four modes, three slots: the three matched pairs and the other cells of their rows and columns
    wide = np.vstack([planted, [[0.0, 0.0, 0.0]]])
    assert tta.clamp_specificity(wide) == (300.0, [(0, 2), (1, 0), (2, 1)])
    assert tta.clamp_specificity(np.array([[5.0, 1.0]]))[0] is None


def mirror4_targets():
    """mirror4's targets as tta_gating resolves them: force signs +1 -1 +1 -1, and a held-out mode 4 of force -1."""
    signs = [1.0, -1.0, 1.0, -1.0, -1.0]
    return [{"name": f"mode{k}", "physics": (9.8, 0.5, sign), "held_out": k == 4} for k, sign in enumerate(signs)]


def test_routing_with_a_slot_per_mode_counts_every_slot_of_the_held_out_modes_sign():
    """Planted gates: modes 0-3 on slots 0-3 (the signs on disjoint sets, two slots each), held-out mode 4 (force -1) on
    slot 3, a force -1 mode's slot; then mode 3 moved to slot 0, which force +1 uses too: no sign slot to route to."""
    targets = mirror4_targets()
    gates = {f"mode{k}": np.eye(4)[k] * 0.7 + 0.075 for k in range(4)}
    gates["mode4"] = np.eye(4)[3] * 0.7 + 0.075
    episodes = {name: np.stack([w, w]) for name, w in gates.items()}
    routing = tta.gate_routing(episodes, gates, targets)
    assert routing["signs_on_disjoint_slots"]
    assert not routing["sign_split"]
    assert routing["held_out"]["mode4"]["sign_slots"] == [1, 3]
    assert routing["held_out"]["mode4"]["to_sign_slot"]
    assert routing["episode_nmi_sign"] == pytest.approx(1.0)
    assert routing["episode_nmi_mode"] == pytest.approx(1.0)
    gates["mode3"] = gates["mode0"]
    episodes["mode3"] = episodes["mode0"]
    shared = tta.gate_routing(episodes, gates, targets)
    assert not shared["signs_on_disjoint_slots"]
    assert shared["held_out"]["mode4"]["to_sign_slot"] is None


def test_episode_nmi_against_a_label():
    assert tta.episode_nmi(["a", "b", "c", "d"], [0, 1, 0, 1], 2) == pytest.approx(0.5)
    assert tta.episode_nmi([1.0, -1.0, 1.0, -1.0], [0, 1, 0, 1], 2) == pytest.approx(1.0)
    assert tta.episode_nmi([1.0, -1.0, 1.0, -1.0], [0, 0, 1, 1], 2) == pytest.approx(0.0)


def test_swap_effect_compares_each_training_modes_own_group_with_the_others():
    """Rows mode0-3 (signs + - + -) and held-out mode4; columns sign+1, sign-1, mode0-3, learned. The sign effect of mode1
    is its sign-1 cell minus its sign+1 cell; the mode effect of mode2 its own column minus the mean of the other three."""
    targets = mirror4_targets()
    columns = ["sign+1", "sign-1", "mode0", "mode1", "mode2", "mode3", "learned"]
    matrix = np.arange(35, dtype=float).reshape(5, 7) ** 1.5
    effect = tta.swap_effect(matrix, targets, columns)
    assert set(effect["sign"]["per_mode"]) == {"mode0", "mode1", "mode2", "mode3"}  # training modes only
    assert effect["sign"]["per_mode"]["mode1"] == matrix[1, 1] - matrix[1, 0]
    assert effect["mode"]["per_mode"]["mode2"] == pytest.approx(matrix[2, 4] - np.mean(matrix[2, [2, 3, 5]]))
    assert effect["sign"]["value"] == pytest.approx(np.mean(list(effect["sign"]["per_mode"].values())))


def test_heatmap_draws_targets_as_rows_and_gate_settings_as_columns(tmp_path, monkeypatch):
    """If this failed, the matrix were drawn transposed and every cell misread."""
    import matplotlib.axes

    images = []
    texts = []
    real_imshow = matplotlib.axes.Axes.imshow
    real_text = matplotlib.axes.Axes.text

    def imshow(self, X, *args, **kwargs):
        images.append(np.array(X))
        return real_imshow(self, X, *args, **kwargs)

    def text(self, x, y, s, *args, **kwargs):
        texts.append((x, y, s))
        return real_text(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", imshow)
    monkeypatch.setattr(matplotlib.axes.Axes, "text", text)
    matrix = {
        "deterministic": np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]]),
        "sampled": np.array([[110.0, 120.0, 130.0], [140.0, 150.0, 160.0]]),
    }
    tta.plot_heatmap(matrix, ["mode0", "mode1"], ["slot0", "slot1", "uniform"], str(tmp_path / "heatmap.png"), "title")
    assert (tmp_path / "heatmap.png").stat().st_size > 0
    assert len(images) == 2
    assert all(np.array_equal(image, matrix[kind]) for image, kind in zip(images, matrix))
    assert texts == [(j, i, f"{v:.0f}") for kind in matrix for (i, j), v in np.ndenumerate(matrix[kind])]
