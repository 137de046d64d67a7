#!/usr/bin/env bash
# Regenerate the reference study's readings and every report folder from the folders themselves:
#   bash scripts/study_reports.sh            (after folding new runs into a folder with `posab report`;
#                                             ~10 min on 2 cores, most of it the bootstrap)
# First the claims (results/study/claims/*.csv tested over every folder's runs.csv: verdicts.csv, the claims
# README and the claims blocks of results/README.md and results/study/README.md), then each folder's report with
# those verdicts, so that a comparison has one verdict in every folder. Each command is the one its part of
# results/study/README.md gives.
set -euo pipefail
cd "$(dirname "$0")/.."
S=results/study
posab claims "$S" --write results/README.md "$S/README.md"
C=(--claims "$S/claims/verdicts.csv")
posab report "$S/budget" --out "$S/budget" "${C[@]}"
posab report "$S/tuning" --out "$S/tuning" "${C[@]}"
posab report "$S/main" --out "$S/main" "${C[@]}" --references nope alibi \
  "multiscale, data.anchors=true, encoding.lr_mult=10, train.lr=0.003" \
  'hierarchical, data.anchors=true, encoding.levels=["token", "sentence", "paragraph"], encoding.lr_mult=10, train.lr=0.003' \
  'hierarchical, data.anchors=false, encoding.levels=["token", "sentence", "paragraph"], encoding.lr_mult=10, train.lr=0.003'
posab report "$S/bpe" --out "$S/bpe" "${C[@]}" --references nope alibi \
  "multiscale, encoding.lr_mult=10, train.lr=0.003" "hierarchical, encoding.lr_mult=10, train.lr=0.003"
posab report "$S/dape" --out "$S/dape" "${C[@]}" --encodings dape_alibi dape_multiscale alibi multiscale \
  --experiments study_main study_extrapolation study_dape --references \
  "alibi, encoding.lr_mult=1.0, train.precision=auto" \
  "multiscale, encoding.clamp=null, encoding.lr_mult=10, train.precision=fp32"
posab report "$S/extrapolation" --out "$S/extrapolation" "${C[@]}" --encodings multiscale alibi hierarchical \
  --experiments study_main study_extrapolation study_clamp --references \
  "alibi, encoding.lr_mult=1.0, precision=fp32" \
  "multiscale, encoding.clamp=null, encoding.input=raw, encoding.lr_mult=10, encoding.max_dist=4096.0, train.precision=auto, precision=bf16" \
  "multiscale, encoding.clamp=null, encoding.input=raw, encoding.lr_mult=10, encoding.max_dist=4096.0, train.precision=bf16, precision=bf16" \
  "multiscale, encoding.clamp=train, encoding.input=raw, encoding.lr_mult=10, encoding.max_dist=4096.0, train.precision=fp32, precision=fp32"
posab report "$S/frontier" --out "$S/frontier" "${C[@]}" --references rope alibi multiscale
posab report "$S/decisive" --out "$S/decisive" "${C[@]}" --references rope alibi multiscale
posab report "$S/clamp_confirm" --out "$S/clamp_confirm" "${C[@]}" --references "multiscale, encoding.clamp=null"
posab needle-report "$S/main" --out "$S/main"
