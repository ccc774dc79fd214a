#!/usr/bin/env bash
# The ASTRAL study on mirror4 with a balanced mode share (protocol: docs/ppo_gru_astral.md, "Study protocol
# (pre-registered)"). Every run uses the fast configuration and saves its model, so eval.json holds the per-mode
# returns (training and held-out modes) and, for ASTRAL, the episode-level NMI.
#   benchmark/astral_study.sh A                task controls: oracle, memoryless, GRU baseline; both observations; seeds 1-5
#   benchmark/astral_study.sh B [1|2]          screen, seeds 1-3: round 1 = plan, each mechanism alone, the combination,
#                                              the supervised-gate ceiling; round 2 = the combination over lambda x K
#   benchmark/astral_study.sh C                confirm, run once: FROZEN vs the baseline vs FROZEN with the supervised gate
#                                              (the ceiling) on seeds 6-15
#   benchmark/astral_study.sh report [A|B|C]   the criterion tables of the phases that have runs
#   benchmark/astral_study.sh --one-seed N     FROZEN and the baseline for seed N alone, then their per-mode returns and NMI
#   add --quick to any of them (alone: A, B 1, C and the report): one seed, a tiny budget, a couple of minutes, output
#   under benchmark/out/astral_study_quick. Other arguments go to benchmark.py (e.g. --workers 2, --dry-run).
set -uo pipefail
cd "$(dirname "$0")/.."

# Filled in from the study's own results, before the phase that needs them (the docs record the values used):
OBS="${ASTRAL_OBS-unset}"          # after Phase A: "--hide-velocity" or "" (full observation), by the controls
COMBO="${ASTRAL_COMBO---bottleneck --slot-init orthonormal --hard-gate --lambda-consistency 0.1}"  # after round 1
FROZEN="${ASTRAL_FROZEN-unset}"    # after Phase B: the one configuration Phase C confirms (e.g. "$COMBO --num-abstractions 4")

steps=2000000
out=benchmark/out/astral_study
eval_episodes=20
quick=0
phase=""
sub=""
one_seed=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --one-seed) one_seed="$2"; shift ;;
        A|B|C|report) phase="$1"; case "${2-}" in 1|2|A|B|C) sub="$2"; shift ;; esac ;;
        *) extra+=("$1") ;;
    esac
    shift
done
if [ "$quick" = 1 ]; then
    steps=8192
    out=benchmark/out/astral_study_quick
    eval_episodes=2
    [ "$OBS" = unset ] && OBS="--hide-velocity"
    [ "$FROZEN" = unset ] && FROZEN="$COMBO --num-abstractions 4"
fi
FAST="--num-envs 64 --num-steps 64 --hidden-size 64"
TASK="--modes-preset mirror4 --mode-share balanced"
COMMON="--total-timesteps $steps $FAST $TASK --save-model --eval-episodes $eval_episodes"
BASELINE="python cleanrl_astral/ppo_gru_baseline.py $COMMON"
ASTRAL="python cleanrl_astral/ppo_gru_astral.py $COMMON --sharpen-gate"
CEILING="--num-abstractions 4 --lambda-supervised 1.0"  # Phase B's diagnostic ceiling: the combination's gate told the true mode

need() {  # refuse a phase whose inputs from an earlier phase are not filled in
    if [ "$2" = unset ]; then echo "astral_study.sh: error: set $1 (from the earlier phase's results) before this phase" >&2; exit 2; fi
}
sweep() {  # sweep <output> <seeds: first count> <grid or ""> <command>...
    local dir="$1"
    local first="$2"
    local count="$3"
    local grid="$4"
    shift 4
    [ "$quick" = 1 ] && count=1
    local grid_args=()
    [ -n "$grid" ] && grid_args=("--grid=$grid")
    python benchmark/benchmark.py --command "$@" "${grid_args[@]}" --start-seed "$first" --num-seeds "$count" \
        --workers 1 --resume --output "$dir" "${extra[@]}"
}
report() {  # report <phase>
    case " ${extra[*]} " in *" --dry-run "*) return 0 ;; esac
    python benchmark/astral_study_report.py --phase "$1" --sweep "$out/phase_$1"* # phase B: both rounds
}

phase_a() {
    # both observations; the quick flavour only the hidden velocity
    local grid="--hide-velocity | "
    local obs=""
    if [ "$quick" = 1 ]; then
        grid=""
        obs="--hide-velocity"
    fi
    sweep "$out/phase_A" 1 5 "$grid" "$BASELINE $obs --oracle --exp-name oracle" "$BASELINE $obs --memory none --exp-name memoryless" \
        "$BASELINE $obs --exp-name gru"
}
phase_b() {
    need ASTRAL_OBS "$OBS"
    if [ "${sub:-1}" = 1 ]; then
        sweep "$out/phase_B" 1 3 "" "$ASTRAL $OBS --num-abstractions 4 --exp-name plan" \
            "$ASTRAL $OBS --num-abstractions 4 --bottleneck --exp-name bottleneck" \
            "$ASTRAL $OBS --num-abstractions 4 --slot-init orthonormal --exp-name orthonormal" \
            "$ASTRAL $OBS --num-abstractions 4 --hard-gate --exp-name hard_gate" \
            "$ASTRAL $OBS --num-abstractions 4 --lambda-consistency 0.1 --exp-name consistency" \
            "$ASTRAL $OBS --num-abstractions 4 $COMBO --exp-name combination" \
            "$ASTRAL $OBS $COMBO $CEILING --exp-name ceiling"
    else  # the last tuning round: the combination over lambda in {0.01, 0.1} and K in {2, 4, 8}
        local base="$ASTRAL $OBS $(echo "$COMBO" | sed -E 's/--lambda-consistency [^ ]+//')"
        local runs=()
        for lam in 0.01 0.1; do for k in 2 4 8; do
            runs+=("$base --lambda-consistency $lam --num-abstractions $k --exp-name round2_lam${lam}_k$k")
        done; done
        sweep "$out/phase_B_round2" 1 3 "" "${runs[@]}"  # its own directory: benchmark.py reruns a run key whose command changed
    fi
}
phase_c() {
    need ASTRAL_OBS "$OBS"; need ASTRAL_FROZEN "$FROZEN"
    # the ceiling is the frozen configuration itself with its gate told the true mode: it bounds what that architecture
    # would gain from slots that name the modes
    sweep "$out/phase_C" 6 10 "" "$ASTRAL $OBS $FROZEN --exp-name frozen" "$BASELINE $OBS --exp-name baseline" \
        "$ASTRAL $OBS $FROZEN --lambda-supervised 1.0 --exp-name ceiling"
}

status=0
if [ -n "$one_seed" ]; then
    need ASTRAL_OBS "$OBS"; need ASTRAL_FROZEN "$FROZEN"
    sweep "$out/one_seed_$one_seed" "$one_seed" 1 "" "$ASTRAL $OBS $FROZEN --exp-name frozen" "$BASELINE $OBS --exp-name baseline" || status=$?
    case " ${extra[*]} " in *" --dry-run "*) exit "$status" ;; esac
    python benchmark/astral_study_report.py --phase C --sweep "$out/one_seed_$one_seed" || status=$?
    exit "$status"
fi
case "$phase" in
    A) phase_a || status=$?; report A || status=$? ;;
    B) phase_b || status=$?; report B || status=$? ;;
    C) phase_c || status=$?; report C || status=$? ;;
    report) for p in ${sub:-A B C}; do [ -d "$out/phase_$p" ] && { report "$p" || status=$?; }; done ;;
    "") if [ "$quick" = 1 ]; then
            for p in a b c; do "phase_$p" || status=$?; done
            for p in A B C; do report "$p" || status=$?; done
        else
            echo "astral_study.sh: error: name a phase (A, B [1|2], C, report) or --one-seed N; see the header" >&2; exit 2
        fi ;;
esac
exit "$status"
