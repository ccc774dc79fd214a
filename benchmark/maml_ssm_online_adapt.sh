#!/usr/bin/env bash
# Online adaptation beside between-batch adaptation (maml_ssm.py adapt): the pre-registered study of
# docs/results/maml_ssm/online_adapt/PREREGISTRATION.md, run at commit a2ecf64, whose maml_ssm.py has the switch only
# this study used (--online-mode during-only, online steps alone in every rollout). Its commands (the study, --tiny,
# --report-only, --dry-run) run there: `git checkout a2ecf64`, then `bash benchmark/maml_ssm_online_adapt.sh`. The
# report script it calls (maml_ssm_online_report.py) stays here and scores the committed results.
echo "maml_ssm_online_adapt.sh: the online-adaptation study runs at commit a2ecf64: git checkout a2ecf64, then run this script" >&2
exit 2
