// C++ CPU codec of unweight format v1: raw pointers in, raw pointers out, no Python.
// bindings_cpu.cpp wraps these with argument checks; every function is thread-parallel over
// independent units (segments, row ranges) with `threads` workers.
//
// One translation unit per part, each with its header, under cpu/:
//   thread_pool     persistent workers behind parallel_for
//   cpu_features    run-time choice of the AVX2/BMI2 and carry-less-multiply builds
//   crc32           checksum of the raw tensor bytes
//   host_alloc      host buffers for decoded tensors (pre-faulted, with a reuse cache)
//   huffman_encode  plane split + histogram, code lengths, segment encoder
//   huffman_decode  table build and the multi-way decode loop
//   palette         palette encode and decode
// What the bits mean comes from decode_primitives.h, shared with the CUDA kernels.
#pragma once
#include "cpu/cpu_features.h"
#include "cpu/crc32.h"
#include "cpu/grid.h"
#include "cpu/host_alloc.h"
#include "cpu/huffman_decode.h"
#include "cpu/huffman_encode.h"
#include "cpu/palette.h"
