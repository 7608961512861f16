/*
 * Prints the layout of `struct cudaDeviceProp` as the CUDA headers on the include path
 * define it, for tests/abi_layout.rs:
 *
 *   version <CUDART_VERSION>
 *   size <sizeof> <alignof>
 *   field <name> <offset> <size> <alignof>     (one line per field, in declaration order)
 *
 * The field list comes from `props_fields.h`, which the test writes (one `FIELD(name)` per
 * member it read from that header's driver_types.h) into a directory on the include path.
 */
#include <stddef.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

typedef struct cudaDeviceProp Prop;

#define FIELD(f)                                                                              \
    printf("field %s %zu %zu %zu\n", #f, offsetof(Prop, f), sizeof(((Prop *)0)->f),         \
           (size_t)__alignof__(((Prop *)0)->f));

int main(void)
{
    printf("version %d\n", CUDART_VERSION);
    printf("size %zu %zu\n", sizeof(Prop), (size_t)__alignof__(Prop));
#include "props_fields.h"
    return 0;
}
