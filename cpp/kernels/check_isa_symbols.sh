#!/usr/bin/env sh
# Fails if an object compiled with AVX flags defines a weak symbol outside its own ISA namespace:
# the linker keeps one copy of each inline function, and an AVX-512 copy of a shared helper would
# crash (SIGILL) on a CPU without AVX-512. (A Debug build once emitted std::sqrt(float) this way.)
#   usage: check_isa_symbols.sh attention|linear|quant|sample "obj1;obj2;..."
#          (the objects: CMake's $<TARGET_OBJECTS:pagedcore_kernels>)
set -eu
case "$1" in
  attention) files='^attention_avx(2|512).*\.o$'
             allowed='kernels::attention_(avx2|avx512|avx512_bf16dot)::' ;;
  linear)    files='^linear_avx(2|512).*\.o$'
             allowed='kernels::linear_(avx2|avx512|avx512_bf16dot)::' ;;
  quant)     files='^quant_linear_avx(2|512).*\.o$'
             allowed='kernels::quant_(avx2|avx512|avx512_vnni)::' ;;
  sample)    files='^sample_rows_avx(2|512).*\.o$'
             allowed='kernels::sample_(avx2|avx512)::' ;;
  *) echo "usage: $0 attention|linear|quant|sample OBJECTS"; exit 2 ;;
esac
NM=${NM:-nm}
status=0
checked=0
old_ifs=$IFS
IFS=';'
for obj in $2; do
  basename "$obj" | grep -qE "$files" || continue
  checked=$((checked + 1))
  bad=$("$NM" -C "$obj" | grep -E ' [WVu] ' | grep -v -E "$allowed|DW\.ref\." || true)
  if [ -n "$bad" ]; then
    echo "$obj defines shared weak symbols (move them into the ISA namespace):"
    echo "$bad"
    status=1
  fi
done
IFS=$old_ifs
echo "checked $checked AVX $1 object(s)"
[ "$checked" -gt 0 ] || { echo "no $1 AVX objects among the objects given"; exit 1; }
exit $status
