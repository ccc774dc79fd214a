#!/usr/bin/env bash
# Which of the script's choices repairs the ASTRAL plan's design, and the current defaults trained: the pre-registered
# studies of docs/results/ppo_gru_astral/one_change/PREREGISTRATION.md, run at commit 9ecf7db, whose ppo_gru_astral.py
# has the switches the arms need (--film-design, --gate-design, --init). Its parts (current, single, pair, tta, report)
# run there: `git checkout 9ecf7db`, then `bash benchmark/astral_one_change.sh PART`. The report scripts it calls
# (astral_one_change_compare.py, astral_one_change_entropy.py) stay here and score the committed results.
echo "astral_one_change.sh: the one-change study runs at commit 9ecf7db: git checkout 9ecf7db, then run this script" >&2
exit 2
