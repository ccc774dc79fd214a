#!/usr/bin/env bash
# The ASTRAL study on mirror4 with a balanced mode share (protocol: docs/ppo_gru_astral.md, "Study protocol
# (pre-registered)"), run at commit 95652a5, whose ppo_gru_astral.py has the switches only this study used
# (--bottleneck, --hard-gate, --gumbel-tau, --lambda-supervised) and reads its checkpoints. Its phases (A, B [1|2], C,
# report, --one-seed N, --quick) run there: `git checkout 95652a5`, then `bash benchmark/astral_study.sh PHASE`. The
# report script it calls (astral_study_report.py) stays here and scores the committed results.
echo "astral_study.sh: the ASTRAL study runs at commit 95652a5: git checkout 95652a5, then run this script" >&2
exit 2
