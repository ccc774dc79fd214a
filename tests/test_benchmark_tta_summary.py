"""Tests of benchmark/tta_summary.py on hand-made tta.json and clamp.json files: paired gains per adaptation seed,
pooling over training seeds, the clamp tables, and the study's criteria 3 and 4."""

import json

import pytest
from benchmark_helpers import load_benchmark_script

tta_summary = load_benchmark_script("tta_summary")


def test_tta_summary_pairs_gains_per_adaptation_seed_and_pools_over_training_seeds(tmp_path):

    def control(after):
        return {"during_per_seed": [[a, a] for a in after], "after_per_seed": {"sampled": after, "deterministic": after}}

    target = {"name": "mode3", "gravity": 9.8, "half_length": 0.5, "force_sign": -1.0}
    # training seed 1: gate gains +2 and +4 over none on the same evaluation episodes; seed 2: +0 and +2
    for seed, none, gate in ((1, [10.0, 20.0], [12.0, 24.0]), (2, [15.0, 15.0], [15.0, 17.0])):
        d = tmp_path / "adapt_inverted" / "runs" / f"c0__g0_base__s{seed}" / "run"
        d.mkdir(parents=True)
        ckpt = f"out/runs/c1__g2_modes-preset_inverted4__s{seed}/run/ppo_gru_astral.cleanrl_model"
        # seed 1 has a ceiling 7 above its before (headroom 6 for a gain of 3), seed 2 none (a run without one)
        ceiling = {"ceiling": {"best": "slot0", "sampled": {"mean": 7.0}}} if seed == 1 else {}
        (d / "tta.json").write_text(
            json.dumps(
                {
                    "checkpoint": ckpt,
                    "targets": [target],
                    "results": {
                        "mode3": {
                            "before": {"sampled": {"mean": 1.0, "ci95": 0.0}},
                            "controls": {"none": control(none), "gate": control(gate)},
                            **ceiling,
                        }
                    },
                }
            )
        )
    out = tmp_path / "tables.md"
    assert tta_summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert (
        "| inverted4 `--hide-velocity` | 1 | mode3 (g 9.8, l 0.5, inverted) | gate | 1.0 ± 0.0 | 18.0 ± 76.2 | 18.0 ± 76.2 "
        "| 18.0 ± 76.2 | 3.0 ± 12.7 | 7.0 (slot0) | 0.50 |"
    ) in text
    assert "| gate | 1.0 ± 0.0 | 16.0 ± 12.7 | 16.0 ± 12.7 | 16.0 ± 12.7 | 1.0 ± 12.7 | — | — |" in text
    # pooled: per-seed mean gains 3 and 1 -> mean 2, t(1) CI 12.706 * 1.414 / 1.414 = 12.7; the fraction of seed 1 only
    assert (
        "| inverted4 `--hide-velocity` | mode3 (g 9.8, l 0.5, inverted) | gate | 2 | 2.0 ± 12.7 | 2/2 | 0.50 (1 seeds) |"
        in text
    )
    assert tta_summary.main(["--root", str(tmp_path / "missing"), "--output", str(out)]) == 2


def test_tta_summary_one_seed_sweep_has_no_ci_and_every_clamp_sweep_gets_a_table(tmp_path):
    target = {"name": "mode0", "gravity": 9.8, "half_length": 0.5, "force_sign": 1.0}
    ckpt = "out/runs/c1__g0_modes-preset_seed3__s3/run/ppo_gru_astral.cleanrl_model"
    d = tmp_path / "adapt_collapsed" / "runs" / "c0__g0_base__s3" / "run"
    d.mkdir(parents=True)

    def ctl(a):
        return {"during_per_seed": [[x] for x in a], "after_per_seed": {"sampled": a, "deterministic": a}}

    def cell(v):
        return {"deterministic": {"mean": v}, "sampled": {"mean": v}}

    (d / "tta.json").write_text(
        json.dumps(
            {
                "checkpoint": ckpt,
                "targets": [target],
                "results": {
                    "mode0": {
                        "before": {"sampled": {"mean": 1.0, "ci95": 0.0}},
                        "controls": {"none": ctl([10.0, 20.0]), "gate": ctl([13.0, 21.0])},
                    }
                },
            }
        )
    )
    for sweep, learned in (("clamp_all", 500.0), ("full", 250.0)):
        d = tmp_path / sweep / "runs" / "c1__g0_base__s3" / "run"
        d.mkdir(parents=True)
        specificity = (
            {"specificity": {"deterministic": {"score": 12.5}, "sampled": {"score": None}}} if sweep == "full" else {}
        )
        (d / "clamp.json").write_text(
            json.dumps(
                {
                    "checkpoint": ckpt,
                    "targets": [target],
                    "columns": ["slot0", "uniform", "learned"],
                    "results": {
                        "mode0": {
                            "slot0": cell(300.0),
                            "uniform": cell(learned),
                            "learned": cell(learned),
                            "learned_slot_weights": [1.0],
                        }
                    },
                    **specificity,
                }
            )
        )
    out = tmp_path / "tables.md"
    assert tta_summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    # one training seed: the pooled gain is its mean paired gain (+3, +1 -> 2.0) with no CI
    assert "| seed3 | mode0 (g 9.8, l 0.5) | gate | 1 | 2.0 (one seed: no CI) | 1/1 |" in text
    # a table per clamp sweep, each from its own clamp.json (max |Δ| vs learned 200 in one, 50 in the other)
    assert "### clamp (`clamp_all`)" in text and "### clamp (`full`)" in text and "### clamp (`clamp_b`)" not in text
    assert (
        "| seed3 | 3 | mode0 (g 9.8, l 0.5) | 300.0 / 500.0 / 500.0 | 300.0 / 500.0 / 500.0 | 200.0 / 200.0 | [1.00] | — / — |"
        in text
    )
    assert (
        "| seed3 | 3 | mode0 (g 9.8, l 0.5) | 300.0 / 250.0 / 250.0 | 300.0 / 250.0 / 250.0 "
        "| 50.0 / 50.0 | [1.00] | 12.5 / — |" in text
    )


def test_tta_summary_reads_the_study_sweeps_and_labels_the_held_out_mode(tmp_path):
    """tta_gating.sh --study's sweeps get their tables, rows named by the study checkpoint (frozen, ceiling) and the
    held-out target labelled as such."""
    target = {"name": "mode4", "gravity": 8.65, "half_length": 0.6, "force_sign": -1.0, "held_out": True}

    def ctl(a):
        return {"during_per_seed": [[x] for x in a], "after_per_seed": {"sampled": a, "deterministic": a}}

    d = tmp_path / "study_adapt_frozen" / "runs" / "c0__g0_base__s6" / "run"
    d.mkdir(parents=True)
    (d / "tta.json").write_text(
        json.dumps(
            {
                "checkpoint": "out/phase_C/runs/c0__g0_base__s6/run/frozen.cleanrl_model",
                "targets": [target],
                "results": {
                    "mode4": {
                        "before": {"sampled": {"mean": 1.0, "ci95": 0.0}},
                        "ceiling": {"best": "slot0", "sampled": {"mean": 9.0}},
                        "controls": {"none": ctl([10.0, 20.0]), "gate": ctl([13.0, 21.0])},
                    }
                },
            }
        )
    )
    out = tmp_path / "tables.md"
    assert tta_summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "`study_adapt_frozen`: 1 runs, training seeds 6" in text
    assert "| frozen | mode4 (g 8.65, l 0.6, inverted, held out) | gate | 1 | 2.0 (one seed: no CI) | 1/1 |" in text


def test_tta_summary_scores_the_study_criteria_3_and_4_as_the_protocol_fixes_them(tmp_path):
    """Criterion 3: per target the t-CI of the mean paired gain over training seeds must lie above 0 and the gain reach
    half the mean gap (negative gaps count 0); `gate` or `context` must pass every target. Criterion 4: deterministic
    specificity >= 200 in >= 8/10 seeds. Fewer than ten training seeds give no verdict."""
    targets = [{"name": f"mode{k}", "gravity": 9.8, "half_length": 0.5, "force_sign": 1.0} for k in (0, 4)]

    def ctl(a):
        return {"during_per_seed": [[x] for x in a], "after_per_seed": {"sampled": a, "deterministic": a}}

    def write(seeds, gate_gain_mode4):
        for s in seeds:
            d = tmp_path / "study_adapt_frozen" / "runs" / f"c0__g0_base__s{s}" / "run"
            d.mkdir(parents=True, exist_ok=True)
            jitter = (s % 2) * 2.0  # gains differ by seed so the CI has a width
            results = {
                # mode0: before 100, ceiling 200 (gap 100); gate gains 60 +- 1, context gains 40 +- 1 (below half the gap)
                "mode0": {
                    "before": {"sampled": {"mean": 100.0, "ci95": 0.0}},
                    "ceiling": {"best": "slot0", "sampled": {"mean": 200.0}},
                    "controls": {
                        "none": ctl([100.0, 100.0]),
                        "gate": ctl([159.0 + jitter, 159.0 + jitter]),
                        "context": ctl([139.0 + jitter, 139.0 + jitter]),
                    },
                },
                # mode4: ceiling below before (gap counted 0): any gain with a CI above 0 passes
                "mode4": {
                    "before": {"sampled": {"mean": 300.0, "ci95": 0.0}},
                    "ceiling": {"best": "slot1", "sampled": {"mean": 250.0}},
                    "controls": {
                        "none": ctl([300.0]),
                        "gate": ctl([300.0 + gate_gain_mode4 + jitter]),
                        "context": ctl([301.0 + jitter]),
                    },
                },
            }
            (d / "tta.json").write_text(
                json.dumps(
                    {"checkpoint": f"x/c0__g0_base__s{s}/run/frozen.cleanrl_model", "targets": targets, "results": results}
                )
            )
            d = tmp_path / "study_clamp_frozen" / "runs" / f"c0__g0_base__s{s}" / "run"
            d.mkdir(parents=True, exist_ok=True)
            cell = {"deterministic": {"mean": 500.0}, "sampled": {"mean": 500.0}}
            (d / "clamp.json").write_text(
                json.dumps(
                    {
                        "checkpoint": f"x/c0__g0_base__s{s}/run/frozen.cleanrl_model",
                        "targets": targets[:1],
                        "columns": ["slot0", "learned"],
                        "results": {"mode0": {"slot0": cell, "learned": cell, "learned_slot_weights": [1.0]}},
                        "specificity": {
                            "deterministic": {"score": 250.0 if s < 13 else 200.0 if s == 13 else 150.0},
                            "sampled": {"score": 10.0},
                        },
                    }
                )
            )

    out = tmp_path / "tables.md"
    write(range(6, 15), 4.0)  # nine of the ten seeds
    assert tta_summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "**criterion 3, frozen: incomplete**" in text and "**criterion 4, frozen: incomplete** (8/9" in text
    write([15], 4.0)
    assert tta_summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "| gate | mode0 (g 9.8, l 0.5) | 10 | 60.0 ± 0.8 | 100.00 | 0.60 | pass |" in text
    assert "| context | mode0 (g 9.8, l 0.5) | 10 | 40.0 ± 0.8 | 100.00 | 0.40 | fail |" in text
    assert "| context | mode4 (g 9.8, l 0.5) | 10 | 2.0 ± 0.8 | 0.00 | no headroom | pass |" in text
    assert "**criterion 3, frozen: PASS** (every target passes for `gate` or `context`; `gate` passes, `context` fails" in text
    assert "**criterion 4, frozen: PASS** (8/10 training seeds ≥ 200)" in text
    # with gains of -0.5 or +1.5 by seed, the gate's gain on mode4 straddles 0: its mean is positive and above half the
    # gap (0), but its CI does not exclude 0, so neither control passes everywhere
    write(range(6, 16), -0.5)
    assert tta_summary.main(["--root", str(tmp_path), "--output", str(out)]) == 0
    text = out.read_text()
    assert "| gate | mode4 (g 9.8, l 0.5) | 10 | 0.5 ± 0.8 | 0.00 | no headroom | fail |" in text
    assert "**criterion 3, frozen: FAIL**" in text
    # a sweep run without the ceiling cannot be scored: one line, no traceback
    run = tmp_path / "study_adapt_frozen" / "runs" / "c0__g0_base__s6" / "run" / "tta.json"
    d = json.loads(run.read_text())
    del d["results"]["mode0"]["ceiling"]
    run.write_text(json.dumps(d))
    with pytest.raises(SystemExit, match="has no ceiling or no `none` control"):
        tta_summary.main(["--root", str(tmp_path), "--output", str(out)])
