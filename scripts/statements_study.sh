#!/usr/bin/env bash
# The new-case statements on the conformal study's hippocampus runs (docs/results.md, "Statements for new cases"):
# per run folder R (its eval/val and eval/test predictions with probabilities, and calibrated_val / calibrated_test
# from mcseg-calibrate-folder as docs/results.md's conformal section makes them), mcseg-new-cases fitted on the 31
# validation cases and applied to the 31 test cases (their labels measure only), raw and after temperature, then
# 200 random splits of the 62 cases at alpha 0.05, 0.1, 0.2. Pieces: $OUT/<name>/<raw|temperature>/.
#   bash scripts/statements_study.sh $HIPPO $OUT name1=R1 name2=R2 ...
set -euo pipefail
hippo=$1 out=$2
shift 2
py=${PYTHON:-.venv/bin/python}
for pair in "$@"; do
    name=${pair%%=*} run=${pair#*=}
    for source in raw temperature; do
        if [ $source = raw ]; then fit=$run/eval/val/predictions apply=$run/eval/test/predictions
        else fit=$run/calibrated_val apply=$run/calibrated_test; fi
        dir=$out/$name/$source
        work=$(mktemp -d)
        "$py" -m mcseg.new_cases --fit "$fit" --reference "$hippo" --apply "$apply" -o "$work/s" --alpha 0.1 \
            > /dev/null
        mkdir -p "$dir"
        cp "$work/s/calibration_cases.csv" "$work/s/new_cases.csv" "$work/s/statements.csv" "$dir/"
        "$py" scripts/statements_validity.py "$dir/calibration_cases.csv" "$dir/new_cases.csv" -o "$dir" \
            --alpha 0.05 0.1 0.2 --repeats 200 --seed 0 > /dev/null
        rm -f "$dir/validity_splits.csv"  # 200 x 3 x 9 rows per run: recomputed from the tables in seconds
        rm -rf "$work"
        echo "$name $source: $dir"
    done
done
"$py" scripts/statements_results.py "$out"
