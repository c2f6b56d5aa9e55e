#!/usr/bin/env bash
# check_peft_load.sh — an adapter trained by `hearth train sft` loads in PEFT
# and gives the same logits there as in hearth. For each golden model NAME
# (a copy with the built-in model's tokenizer, since the golden folders hold
# none): three steps of `hearth train sft` on every linear projection, then
# `hearth logits --all --adapter` beside transformers + PeftModel.from_pretrained
# on the same ids (float32 both); prints one line per model and exits non-zero
# if any differs by more than 1e-4 of the largest logit, or if the adapter
# changed nothing. Needs python3 with torch, transformers and peft (the GPU
# machine has them; nothing here runs on the GPU).
#
#   tools/check_peft_load.sh HEARTH [OUT (/tmp/peft_load)] [NAME...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
h=$(realpath "$1") out=${2:-/tmp/peft_load}
shift $(($# < 2 ? $# : 2))
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(llama-f32 mistral-f32 qwen2-f32 qwen3-f32 smollm3-f32 gemma2-f32 gemma3-f32 phi3-f32)
mkdir -p "$out"
fails=0
for n in "${names[@]}"; do
  d=$out/$n
  rm -rf "$d" && mkdir -p "$d/model" && cp -r "$root/tests/fixtures/golden/$n"/. "$d/model"/
  cp "$root/models/default/tokenizer.json" "$root/models/default/tokenizer_config.json" "$d/model/"
  for i in $(seq 24); do printf '{"prompt": "%d %d", "completion": " %d %d"}\n' "$i" "$((i + 1))" "$((i + 2))" "$((i + 3))"; done >"$d/train.jsonl"
  if ! "$h" train sft --model "$d/model" --data "$d/train.jsonl" --out "$d/adapter" --steps 3 --lr 1e-2 --target all-linear \
      --seed 5 >"$d/train.log" 2>&1; then
    echo "$n FAIL hearth train: $(tail -n 1 "$d/train.log")"; fails=$((fails + 1)); continue
  fi
  ids=3,17,42,99,250,7,311,5,64,128,400,2
  "$h" logits --model "$d/model" --ids "$ids" --all --adapter "$d/adapter" >"$d/hearth.json" 2>"$d/logits.err" &&
    "$h" logits --model "$d/model" --ids "$ids" --all >"$d/base.json" 2>>"$d/logits.err" ||
    { echo "$n FAIL hearth logits: $(tail -n 1 "$d/logits.err")"; fails=$((fails + 1)); continue; }
  if ! python3 - "$d" "$ids" "$n" <<'PY'; then fails=$((fails + 1)); fi
import json, sys
import torch, transformers, peft
d, ids, name = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
model = transformers.AutoModelForCausalLM.from_pretrained(d + "/model", torch_dtype=torch.float32, attn_implementation="eager")
model = peft.PeftModel.from_pretrained(model, d + "/adapter").eval()
with torch.no_grad():
    ref = model(input_ids=torch.tensor([ids])).logits[0]
got = torch.tensor(json.load(open(d + "/hearth.json"))["logits"], dtype=torch.float32)
base = torch.tensor(json.load(open(d + "/base.json"))["logits"], dtype=torch.float32)
scale = float(ref.abs().max())
diff, moved = float((got - ref).abs().max()), float((base - ref).abs().max())
ok = diff <= 1e-4 * scale and moved > 1e-3 * scale
print(f"{name} {'PASS' if ok else 'FAIL'} PEFT's logits vs hearth's: max |diff| {diff:.3g} (largest logit {scale:.3g}); "
      f"the adapter moves them by {moved:.3g}")
sys.exit(0 if ok else 1)
PY
done
echo "check_peft_load: $((${#names[@]} - fails)) of ${#names[@]} passed"
[ "$fails" -eq 0 ]
