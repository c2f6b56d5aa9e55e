#!/usr/bin/env bash
# llamacpp.sh — llama.cpp's CUDA build, the peer of bench/cuda/peers.sh, from
# the source that npm node-llama-cpp@3.21.1 ships (package/llama/gitRelease.bundle).
#
#   bench/cuda/llamacpp.sh pack TARBALL     here: the source, trimmed to what llama-bench and
#                                           llama-batched-bench need (no other backends, tools or models), as .tar.xz
#   bench/cuda/llamacpp.sh build TARBALL DIR
#                                           on the GPU machine: DIR/bin/{llama-bench,llama-batched-bench}, CUDA for
#                                           this GPU's architecture (CUDA_ARCH, default 90-real) with flash attention
set -euo pipefail
case ${1:-} in
  pack)
    out=$(realpath -m "$2") t=$(mktemp -d)
    (cd "$t" && npm pack --silent node-llama-cpp@3.21.1 >/dev/null && tar xzf node-llama-cpp-3.21.1.tgz package/llama/gitRelease.bundle \
      && git clone -q package/llama/gitRelease.bundle llama.cpp 2>/dev/null)
    cd "$t/llama.cpp"
    other='ggml-(virtgpu|cann|openvino|webgpu|et|metal|hexagon|sycl|vulkan|opencl|zdnn|musa|rpc|blas|kompute|zendnn|hip)$'
    # shellcheck disable=SC2046
    tar cJf "$out" --exclude=.git CMakeLists.txt cmake include src common vendor tools/CMakeLists.txt tools/batched-bench \
      tools/llama-bench $(ls -d ggml/* | grep -v '^ggml/src$') $(ls -d ggml/src/* | grep -vE "$other")
    rm -rf "$t"
    ls -la "$out" ;;
  build)
    tarball=$(realpath "$2") dir=$(realpath -m "$3")
    rm -rf "$dir" && mkdir -p "$dir/src" && tar xJf "$tarball" -C "$dir/src"
    cd "$dir/src"
    printf 'add_subdirectory(batched-bench)\nadd_subdirectory(llama-bench)\n' >tools/CMakeLists.txt
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90-real}" \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF >"$dir/cmake.log" 2>&1
    cmake --build build -j "$(nproc)" --target llama-bench llama-batched-bench >"$dir/build.log" 2>&1
    mkdir -p "$dir/bin" && cp build/bin/llama-bench build/bin/llama-batched-bench build/bin/*.so* "$dir/bin/" 2>/dev/null || true
    ls "$dir/bin" ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
