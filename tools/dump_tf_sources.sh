#!/usr/bin/env bash
# Copies the transformers sources that define the architectures hearth
# implements (modeling + configuration files, rope and masking utilities)
# into one tarball, for reading next to hearth's model code.
set -euo pipefail
out=${1:?usage: dump_tf_sources.sh OUT.tar.gz}
tf=$(python3 -c "import transformers,os;print(os.path.dirname(transformers.__file__))")
cd "$tf"
files="modeling_rope_utils.py masking_utils.py activations.py configuration_utils.py"
for a in llama mistral qwen2 qwen3 smollm3 phi3 gemma2 gemma3 gemma4 qwen3_moe qwen3_5 qwen3_5_moe \
    glm_moe_dsa diffusion_gemma qwen3_vl; do
  files="$files $(ls models/$a/modeling_$a.py models/$a/configuration_$a.py models/$a/generation_$a.py 2>/dev/null || true)"
done
tar czf "$out" $files
