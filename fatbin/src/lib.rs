//! CUDA fat binaries: containers, entries, decompression and cubin kernel metadata.
