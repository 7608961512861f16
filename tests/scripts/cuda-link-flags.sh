#!/usr/bin/env bash
# The libraries a tests/cuda program links, from the headers it includes, as any such program
# is built: the driver API (cuda.h), NVIDIA's math libraries and cuDNN; and the nvcc flags the
# program asks for itself (a line `// nvcc flags: --extended-lambda`).
# Usage: tests/scripts/cuda-link-flags.sh FILE.cu   (prints the -l flags, then the own ones)
src=$1
flags=""
for pair in cuda.h:-lcuda cublas_v2.h:-lcublas cublasLt.h:-lcublasLt cufft.h:-lcufft \
  curand.h:-lcurand cusparse.h:-lcusparse cusolverDn.h:-lcusolver cudnn.h:-lcudnn; do
  header=${pair%%:*}
  grep -q "#include <$header>" "$src" && flags="$flags ${pair#*:}"
done
# The driver API's test programs reach cuda.h through their shared header.
case " $flags " in *" -lcuda "*) ;; *) grep -q '#include "driver_check.h"' "$src" && flags="-lcuda$flags" ;; esac
# The program's own flags.
own=$(sed -n 's|^// nvcc flags:||p' "$src")
echo $flags $own
