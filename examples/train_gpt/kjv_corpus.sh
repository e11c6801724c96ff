#!/usr/bin/env bash
# Writes the corpus of muon-train-gpt --preset kjv: the King James Bible as
# Debian's bible-kjv ships it (its `bible` program reading bible-kjv-text's
# /usr/lib/bible.data), as plain text, one verse a line without its
# reference: 31,102 lines, 4,137,850 bytes, 63 distinct characters (newline
# included).
#
#   kjv_corpus.sh [BIBLE_PROGRAM] OUT
set -euo pipefail
if (($# == 2)); then bible=$1; shift; else bible=bible; fi
out=${1:?usage: kjv_corpus.sh [BIBLE_PROGRAM] OUT}
# "Ge1:1 In the beginning ..." -> "In the beginning ..."
"$bible" -f Gen1:1-Rev22:21 </dev/null | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //' >"$out.tmp"
lines=$(wc -l <"$out.tmp")
if [[ $lines != 31102 ]]; then
  echo "kjv_corpus.sh: $bible gave $lines verses, not the 31102 of the King James Bible" >&2
  rm -f "$out.tmp"
  exit 1
fi
mv "$out.tmp" "$out"
