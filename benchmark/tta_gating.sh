#!/usr/bin/env bash
# Experiment tta_gating: test-time adaptation of the ASTRAL gate (controls none / gate / context / all / tent, after
# the ceiling of fixed gates) and slot clamping, on the ASTRAL checkpoints of the ppo_gru_astral sweep: seed3, seed3 --hide-velocity and
# inverted4 --hide-velocity on their training modes, plus unseen physics (g 5.0, l 0.9; g 15.0, l 0.3; inverted force)
# for the seed3 agents. Seed N of this sweep adapts the checkpoint of training seed N. Budget: agents that score 500
# make every episode 500 steps, so the full flavour takes hours on 2 cores (see docs/tta_gating.md).
#   benchmark/tta_gating.sh                      full: 5 checkpoints per setting -> report in docs/results/tta_gating
#   benchmark/tta_gating.sh --budget             what docs/tta_gating.md reports (~1 h on 2 cores): adapt only where an agent
#                                                has headroom (the inverted force: mode 3 of the inverted4 agents, episodic and
#                                                online; unseen for the seed3 agents) and clamp on mode 3 and on the two unseen
#                                                upright physics, 5 training seeds -> benchmark/out/tta_gating/<sweep>
#   benchmark/tta_gating.sh --quick              smoke (minutes) on benchmark/out/ppo_gru_astral_quick -> benchmark/out/tta_gating_quick/report
#   benchmark/tta_gating.sh --study              criteria 3 and 4 of the ASTRAL study (docs/ppo_gru_astral.md) on its Phase C
#                                                checkpoints (benchmark/out/astral_study/phase_C, seeds 6-15): adapt on every mode,
#                                                held-out mode 4 included, and clamp on the training modes 0-3, for the frozen
#                                                configuration and the supervised-gate ceiling -> benchmark/out/tta_gating/study_* (--output)
#   benchmark/tta_gating.sh --swap               the gate swap and sign-level routing on the same 20 Phase C checkpoints (frozen and
#                                                ceiling, seeds 6-15), one run at a time (~20 s of CPU each), 20 episodes per cell
#                                                -> benchmark/out/tta_gating/phase_C_swap_*, table in docs/results/tta_gating/phase_C_swap.md
#   benchmark/tta_gating.sh --train-sweep DIR    read the checkpoints from another sweep (its command 1 must be ppo_gru_astral.py
#                                                with the grid seed3 | seed3 --hide-velocity | inverted4 --hide-velocity)
# Other arguments go to benchmark.py (e.g. --num-seeds 2, --dry-run, --backend ray --ray-address auto). Re-running
# continues a killed sweep; the script exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0 budget=0 study=0 swap=0 dry_run=0 train="" out="" report=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --budget) budget=1 ;;
        --study) study=1 ;;
        --swap) swap=1 ;;
        --train-sweep) train="$2"; shift ;;
        --output) out="$2"; shift ;;
        --report) report="$2"; shift ;;
        --dry-run) dry_run=1; extra+=("$1") ;;
        *) extra+=("$1") ;;
    esac
    shift
done

if [ "$study" = 1 ] || [ "$swap" = 1 ]; then
    echo "tta_gating.sh: --study and --swap read the ASTRAL study's Phase C checkpoints, which commit 95652a5 reads: git checkout 95652a5, then run this script" >&2
    exit 2
fi

if [ "$swap" = 1 ]; then
    # an analysis of the Phase C checkpoints found after looking at them; --seed {seed} replays each one's own evaluation
    P=${train:-benchmark/out/astral_study/phase_C}/runs out=${out:-benchmark/out/tta_gating} status=0
    for name in frozen ceiling; do
        python benchmark/benchmark.py --command "python cleanrl_astral/tta_gating.py swap --eval-episodes 20 \
            --checkpoint '$P/c*__s{seed}/*/$name.cleanrl_model'" --start-seed 6 --num-seeds 10 --workers 1 --resume \
            --no-progress --output "$out/phase_C_swap_$name" "${extra[@]}" || status=1
    done
    if [ "$dry_run" = 0 ]; then
        python benchmark/tta_summary.py --root "$out" --phase-c-swap --output docs/results/tta_gating/phase_C_swap.md || status=1
    fi
    exit "$status"
fi

if [ "$study" = 1 ]; then
    # one checkpoint per Phase C seed and configuration (its --exp-name names the model file)
    P=${train:-benchmark/out/astral_study/phase_C}/runs out=${out:-benchmark/out/tta_gating} status=0
    for name in frozen ceiling; do
        ck="--checkpoint '$P/c*__s{seed}/*/$name.cleanrl_model'"
        for cmd in "adapt --episodes 30 --num-seeds 3 --eval-episodes 10 --adapt-lr 0.03 --controls none gate context $ck:adapt" \
                   "clamp --eval-episodes 10 --mode-indices 0 1 2 3 $ck:clamp"; do
            python benchmark/benchmark.py --command "python cleanrl_astral/tta_gating.py ${cmd%:*}" --start-seed 6 --num-seeds 10 \
                --workers 2 --resume --no-progress --output "$out/study_${cmd##*:}_$name" "${extra[@]}" || status=1
        done
    done
    if [ "$dry_run" = 0 ]; then
        python benchmark/tta_summary.py --root "$out" --output "$out/study_tables.md" || status=1
    fi
    exit "$status"
fi

if [ "$budget" = 1 ]; then
    # the sweeps of docs/tta_gating.md; --resume skips the runs a killed sweep already finished
    C=${train:-benchmark/out/cartpole_main}/runs
    A="python cleanrl_astral/tta_gating.py adapt"
    B="--episodes 30 --num-seeds 3 --eval-episodes 10 --adapt-lr 0.03"
    inv="--checkpoint '$C/c1__g2_*__s{seed}/*/ppo_gru_astral.cleanrl_model'"
    s3="--checkpoint '$C/c1__g0_*__s{seed}/*/ppo_gru_astral.cleanrl_model'"
    s3hv="--checkpoint '$C/c1__g1_*__s{seed}/*/ppo_gru_astral.cleanrl_model'"
    status=0
    run() { python benchmark/benchmark.py --num-seeds 5 --workers 2 --resume --no-progress "$@" "${extra[@]}" || status=1; }
    run --command "$A --mode-indices 3 $B $inv" --output benchmark/out/tta_gating/adapt_inverted
    run --command "$A --modes '9.8,0.5,-1' $B $s3" --output benchmark/out/tta_gating/adapt_unseen_inverted
    run --command "python cleanrl_astral/tta_gating.py clamp --eval-episodes 5" \
        --grid "$inv --mode-indices 3 | $s3 --modes '5.0,0.9 15.0,0.3' | $s3hv --modes '5.0,0.9 15.0,0.3'" \
        --output benchmark/out/tta_gating/clamp_b
    run --command "$A --online --online-every 8 --mode-indices 3 $B $inv" --output benchmark/out/tta_gating/adapt_inverted_online
    # the one agent with headroom on upright training modes: inverted4 --hide-velocity training seed 3 collapsed
    # to ~170-230 on modes 0-2 (docs/ppo_gru_astral.md)
    run --command "$A --mode-indices 0 1 2 $B $inv" --start-seed 3 --num-seeds 1 --output benchmark/out/tta_gating/adapt_collapsed
    # the one seed3 agent below 500 on an unseen upright physics (seed3 --hide-velocity seed 4 on g 15.0, l 0.3)
    run --command "$A --modes '15.0,0.3' $B $s3hv" --start-seed 4 --num-seeds 1 --output benchmark/out/tta_gating/adapt_unseen_upright
    # clamp on every training mode and on the unseen inverted force, all 5 training seeds (8-11 s a run)
    run --command "python cleanrl_astral/tta_gating.py clamp --eval-episodes 5" \
        --grid "$inv | $s3 | $s3hv | $s3 --modes '9.8,0.5,-1' | $s3hv --modes '9.8,0.5,-1'" \
        --output benchmark/out/tta_gating/clamp_all
    if [ "$dry_run" = 0 ]; then
        python benchmark/tta_summary.py --root benchmark/out/tta_gating --output docs/results/tta_gating/budget_tables.md || status=1
    fi
    exit "$status"
fi

if [ "$quick" = 1 ]; then
    train=${train:-benchmark/out/ppo_gru_astral_quick} out=${out:-benchmark/out/tta_gating_quick} report=${report:-benchmark/out/tta_gating_quick/report}
    seeds=1 budget="--episodes 3 --num-seeds 1 --eval-episodes 2" clamp_budget="--eval-episodes 2"
else
    train=${train:-benchmark/out/cartpole_main} out=${out:-benchmark/out/tta_gating} report=${report:-docs/results/tta_gating}
    seeds=5 budget="--episodes 30 --num-seeds 3 --eval-episodes 10 --adapt-lr 0.03" clamp_budget="--eval-episodes 10"
fi

# {seed} is replaced by the run's --seed inside tta_gating.py, the glob must match exactly one checkpoint
ckpt() { echo "--checkpoint $train/runs/c1__g$1_*__s{seed}/*/ppo_gru_astral.cleanrl_model"; }
# unseen physics: two upright settings and the inverted force the seed3 agents never saw
unseen="--modes '5.0,0.9 15.0,0.3 9.8,0.5,-1'"
grid="$(ckpt 0) | $(ckpt 1) | $(ckpt 2) | $(ckpt 0) $unseen | $(ckpt 1) $unseen"

python benchmark/benchmark.py \
    --command "python cleanrl_astral/tta_gating.py adapt $budget" \
              "python cleanrl_astral/tta_gating.py clamp $clamp_budget" \
    --grid "$grid" --num-seeds "$seeds" --workers 2 --resume --output "$out" "${extra[@]}"
status=$?
if [ "$dry_run" = 1 ]; then exit "$status"; fi

python benchmark/report.py --sweep "$out" --output "$report" --title "tta_gating: gate adaptation and slot clamping" \
    --labels 0=tta_adapt 1=tta_clamp || status=$?
exit "$status"
