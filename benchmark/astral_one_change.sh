#!/usr/bin/env bash
# Which of the script's choices repairs the ASTRAL plan's design, and the current defaults trained: the pre-registered
# studies of docs/results/ppo_gru_astral/one_change/PREREGISTRATION.md, run once each, alone on an idle machine.
#   benchmark/astral_one_change.sh current   the script's defaults (the plan's gate-entropy sign) on seed3, seeds 1-5,
#                                            500k, and Phase C's frozen configuration with that sign, seeds 6-10, 2M
#   benchmark/astral_one_change.sh single    seed3, seeds 1-5, 500k: the plan's design, then the plan's design with one
#                                            of the script's choices switched in at a time (five arms)
#   benchmark/astral_one_change.sh pair      the plan's design with the pair of choices the single arms point to
#                                            (ASTRAL_PAIR, filled in from the single arms by the registered rule)
#   benchmark/astral_one_change.sh tta       expected results 3 and 4 on the plan's task: adapt-plan and clamp on the
#                                            plan-design arm's seed3 checkpoints (K = 3)
#   benchmark/astral_one_change.sh report    per-mode tables; archive of each run's marker and eval.json, and of its
#                                            last logged per-step gate entropy, into docs/results/ppo_gru_astral/one_change;
#                                            criteria 1, 3 and 4 and the pair rule (astral_one_change_compare.py)
#   add --quick to any of them: one seed, a tiny budget, output under benchmark/out/astral_one_change_quick. Other
#   arguments go to benchmark.py (e.g. --dry-run, which prints the commands and runs nothing).
set -uo pipefail
cd "$(dirname "$0")/.."

# The flags that switch in one of the script's choices under --design plan; `single`/`pair` refuse to start while
# ppo_gru_astral.py's `--help` does not list one of them.
FILM_IDENTITY="${ASTRAL_FILM_IDENTITY---film-design script}"    # one Linear(d, 2H), gamma = 1 + ...: identity at z = 0
TANH_GATE="${ASTRAL_TANH_GATE---gate-design script}"            # Linear(H, 64) - tanh - Linear(64, K), last std 0.01
ORTHOGONAL_INIT="${ASTRAL_ORTHOGONAL_INIT---init orthogonal}"   # layer_init of encoder and heads, orthogonal GRU
SLOTS_32="--slot-dim 32"
SCRIPT_CONFIG="--hidden-size 128 --num-envs 32 --learning-rate 1e-3 --adam-eps 1e-5 --anneal-lr --norm-reward --clip-vloss"
PAIR="${ASTRAL_PAIR-unset}"  # after `single`: the two arms' flags, by the registered pair rule

out=benchmark/out/astral_one_change
report_dir=docs/results/ppo_gru_astral/one_change
seeds=5 steps=500000 steps_c=2000000 eval_episodes=20
clamp="--eval-episodes 10"
quick=0 dry_run=0 part=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --dry-run) dry_run=1; extra+=("$1") ;;
        current|single|pair|tta|report) part="$1" ;;
        *) extra+=("$1") ;;
    esac
    shift
done
adapt_plan=""
if [ "$quick" = 1 ]; then
    out=benchmark/out/astral_one_change_quick
    report_dir=$out/report
    seeds=1 steps=8192 steps_c=8192 eval_episodes=2
    adapt_plan="--episodes 2 --num-seeds 1 --eval-episodes 2"
    clamp="--eval-episodes 2"
fi
PLAN="python cleanrl_astral/ppo_gru_astral.py --design plan --save-model --eval-episodes $eval_episodes --total-timesteps $steps"
SCRIPT="python cleanrl_astral/ppo_gru_astral.py --save-model --eval-episodes $eval_episodes --total-timesteps $steps"
# Phase C's frozen configuration (benchmark/astral_study.sh C with ASTRAL_OBS=--hide-velocity
# ASTRAL_FROZEN="--num-abstractions 4 --slot-init orthonormal") without its --sharpen-gate
PHASE_C="python cleanrl_astral/ppo_gru_astral.py --total-timesteps $steps_c --num-envs 64 --num-steps 64 --hidden-size 64 \
--modes-preset mirror4 --mode-share balanced --save-model --eval-episodes $eval_episodes --hide-velocity --num-abstractions 4 \
--slot-init orthonormal"

need_flags() {  # refuse to start while ppo_gru_astral.py lacks a flag an arm needs
    local help flag
    help=$(python cleanrl_astral/ppo_gru_astral.py --help 2>&1)
    for flag in "$@"; do
        case "$flag" in --*) ;; *) continue ;; esac
        if ! grep -q -- "$flag[ ,{]" <<< "$help"; then
            echo "astral_one_change.sh: error: ppo_gru_astral.py has no $flag; the study needs it (see the PREREGISTRATION)" >&2
            exit 2
        fi
    done
}
sweep() {  # sweep <output> <first seed> <count> <command>...
    local dir="$1"
    local first="$2"
    local count="$3"
    shift 3
    python benchmark/benchmark.py --command "$@" --start-seed "$first" --num-seeds "$count" --workers 2 --resume \
        --output "$dir" "${extra[@]}"
}

status=0
case "$part" in
    current)
        sweep "$out/current_seed3" 1 "$seeds" "$SCRIPT --modes-preset seed3 --exp-name script_plan_sign" || status=$?
        sweep "$out/current_phase_c" 6 "$seeds" "$PHASE_C --exp-name frozen_plan_sign" || status=$? ;;
    single)
        # shellcheck disable=SC2086
        need_flags $FILM_IDENTITY $TANH_GATE $ORTHOGONAL_INIT
        sweep "$out/single" 1 "$seeds" "$PLAN --exp-name plan" "$PLAN $FILM_IDENTITY --exp-name film_identity" \
            "$PLAN $TANH_GATE --exp-name tanh_gate" "$PLAN $SLOTS_32 --exp-name slots_32" \
            "$PLAN $ORTHOGONAL_INIT --exp-name orthogonal_init" "$PLAN $SCRIPT_CONFIG --exp-name script_config" || status=$? ;;
    pair)
        if [ "$PAIR" = unset ]; then
            echo "astral_one_change.sh: error: set ASTRAL_PAIR to the two single arms' flags (the registered pair rule)" >&2
            exit 2
        fi
        # shellcheck disable=SC2086
        need_flags $PAIR
        sweep "$out/pair" 1 "$seeds" "$PLAN $PAIR --exp-name pair" || status=$? ;;
    tta)
        ck="--checkpoint '$out/single/runs/c0__g0_base__s{seed}/*/plan.cleanrl_model'"
        sweep "$out/tta_adapt_plan" 1 "$seeds" "python cleanrl_astral/tta_gating.py adapt-plan $ck $adapt_plan" || status=$?
        sweep "$out/tta_clamp" 1 "$seeds" "python cleanrl_astral/tta_gating.py clamp $ck $clamp" || status=$? ;;
    report)
        if [ "$dry_run" = 0 ]; then
            for sweep_dir in current_seed3 single pair; do
                [ -d "$out/$sweep_dir" ] || continue
                python benchmark/astral_study_report.py --phase C --sweep "$out/$sweep_dir" \
                    --archive "$report_dir/${sweep_dir}_runs" || status=$?
                python benchmark/report.py --sweep "$out/$sweep_dir" --output "$report_dir/$sweep_dir" \
                    --title "One change at a time: $sweep_dir" || status=$?
                python benchmark/astral_one_change_entropy.py "$out/$sweep_dir" "$report_dir/${sweep_dir}_runs" || status=$?
            done
            # criteria 1, 3 and 4 and the pair rule over the archived arms, beside the script's design
            archives=()
            for sweep_dir in current_seed3 single pair; do
                [ -d "$report_dir/${sweep_dir}_runs/markers" ] && archives+=("$report_dir/${sweep_dir}_runs")
            done
            if [ -d "$report_dir/single_runs/markers" ]; then
                python benchmark/astral_one_change_compare.py "${archives[@]}" || status=$?
            fi
            if [ -d "$out/current_phase_c" ]; then
                python benchmark/astral_study_report.py --phase C --sweep "$out/current_phase_c" \
                    --archive "$report_dir/current_phase_c_runs" > /dev/null || status=$?
                python benchmark/astral_one_change_entropy.py "$out/current_phase_c" "$report_dir/current_phase_c_runs" || status=$?
                # beside Phase C's rows of the same seeds, which trained with the sharpening sign
                python benchmark/astral_study_report.py --phase C --sweep "$out/current_phase_c" \
                    docs/results/ppo_gru_astral/study/phase_C_runs --seeds 6 7 8 9 10 || status=$?
            fi
            if [ -d "$out/tta_clamp" ]; then
                python benchmark/astral_study_report.py --phase T --sweep "$out/tta_adapt_plan" "$out/tta_clamp" || status=$?
                mkdir -p "$report_dir/tta"
                for f in "$out"/tta_adapt_plan/runs/*/*/tta.json "$out"/tta_clamp/runs/*/*/clamp.json; do
                    [ -f "$f" ] || continue
                    seed=${f#*__s}
                    seed=${seed%%/*}
                    case "$f" in
                        */tta.json) cp "$f" "$report_dir/tta/adapt_plan_s$seed.tta.json" ;;
                        *) cp "$f" "$report_dir/tta/clamp_s$seed.clamp.json" ;;
                    esac
                done
            fi
        fi ;;
    *) echo "astral_one_change.sh: error: name a part (current, single, pair, tta, report); see the header" >&2; exit 2 ;;
esac
exit "$status"
