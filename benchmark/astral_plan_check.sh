#!/usr/bin/env bash
# Does the ASTRAL study's verdict hold for the design as the plan wrote it? The pre-registered check of
# docs/results/ppo_gru_astral/plan_design/PREREGISTRATION.md, run once, alone on an idle machine.
#   benchmark/astral_plan_check.sh a        seed3: the plan's ASTRAL (K = 3) against the plan's baseline, seeds 1-5, 500k
#   benchmark/astral_plan_check.sh b        mirror4 balanced, hidden velocity: the plan's ASTRAL with K = 4, seeds 6-10, 2M
#   benchmark/astral_plan_check.sh tta      on part b's checkpoints: gate adaptation at the plan's setting and at the
#                                           study's, and the slot clamps (criteria 3 and 4)
#   benchmark/astral_plan_check.sh report   the criterion tables of parts a and b (b beside Phase C's rows of seeds 6-10)
#   add --quick to any of them: one seed, a tiny budget, output under benchmark/out/astral_plan_check_quick. Other
#   arguments go to benchmark.py (e.g. --dry-run, which prints the commands and runs nothing).
set -uo pipefail
cd "$(dirname "$0")/.."

out=benchmark/out/astral_plan_check
seeds_a=5 seeds_b=5 steps_a=500000 steps_b=2000000 eval_episodes=20
plan_tta="--episodes 20 --num-seeds 3 --eval-episodes 10 --adapt-lr 1e-4 --controls none gate --ceiling-resolution 1"
study_tta="--episodes 30 --num-seeds 3 --eval-episodes 10 --adapt-lr 0.03 --controls none gate context --ceiling-resolution 1"
clamp="--eval-episodes 10 --mode-indices 0 1 2 3"
quick=0 dry_run=0 part=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --dry-run) dry_run=1; extra+=("$1") ;;
        a|b|tta|report) part="$1" ;;
        *) extra+=("$1") ;;
    esac
    shift
done
if [ "$quick" = 1 ]; then
    out=benchmark/out/astral_plan_check_quick
    seeds_a=1 seeds_b=1 steps_a=2048 steps_b=2048 eval_episodes=2
    plan_tta="--episodes 2 --num-seeds 1 --eval-episodes 2 --adapt-lr 1e-4 --controls none gate"
    study_tta="--episodes 2 --num-seeds 1 --eval-episodes 2 --adapt-lr 0.03 --controls none gate context"
    clamp="--eval-episodes 2 --mode-indices 0 1 2 3"
fi
# --design plan: the plan's network and Config (8 envs x 128 steps, d_model 64, lr 3e-4, ...); the plan's gate entropy
ASTRAL="python cleanrl_astral/ppo_gru_astral.py --design plan --save-model --eval-episodes $eval_episodes"
BASELINE="python cleanrl_astral/ppo_gru_baseline.py --design plan --save-model --eval-episodes $eval_episodes"
MIRROR="--modes-preset mirror4 --mode-share balanced --hide-velocity"

sweep() {  # sweep <output> <first seed> <count> <command>...
    local dir="$1"
    local first="$2"
    local count="$3"
    shift 3
    python benchmark/benchmark.py --command "$@" --start-seed "$first" --num-seeds "$count" --workers 1 --resume \
        --output "$dir" "${extra[@]}"
}

status=0
case "$part" in
    a) sweep "$out/a" 1 "$seeds_a" "$ASTRAL --total-timesteps $steps_a --exp-name plan" \
           "$BASELINE --total-timesteps $steps_a --exp-name baseline" || status=$? ;;
    b) sweep "$out/b" 6 "$seeds_b" "$ASTRAL --total-timesteps $steps_b $MIRROR --num-abstractions 4 --exp-name plan" || status=$? ;;
    tta)
        ck="--checkpoint '$out/b/runs/c0__g0_base__s{seed}/*/plan.cleanrl_model'"
        for setting in "plan_setting:adapt $plan_tta" "study_setting:adapt $study_tta" "clamp:clamp $clamp"; do
            sweep "$out/tta_${setting%%:*}" 6 "$seeds_b" "python cleanrl_astral/tta_gating.py ${setting#*:} $ck" || status=$?
        done ;;
    report)
        if [ "$dry_run" = 0 ]; then
            python benchmark/astral_study_report.py --phase P --sweep "$out/a" || status=$?
            python benchmark/astral_study_report.py --phase C --sweep "$out/b" docs/results/ppo_gru_astral/study/phase_C_runs \
                --seeds 6 7 8 9 10 || status=$?
        fi ;;
    *) echo "astral_plan_check.sh: error: name a part (a, b, tta, report); see the header" >&2; exit 2 ;;
esac
exit "$status"
