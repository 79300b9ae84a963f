// IDX files, the format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): a 4-byte
// magic (0, 0, element type, number of dims), one big-endian u32 per dim, then the elements,
// big-endian, in row-major order. Usually distributed gzipped.
#pragma once

#include <string>

#include "core/tensor.h"

namespace tandem::data {

// Reads an IDX file, plain or gzipped (told apart by its first bytes, not its name), into a new
// contiguous CPU tensor of `dtype` whose shape is the file's dims.
//
// Element types: u8 (0x08), i8 (0x09), i16 (0x0B), i32 (0x0C), f32 (0x0D), f64 (0x0E). Integer
// elements convert to any dtype (bool: nonzero is true; u8/i8/i16 fit i32 exactly); float
// elements only to the floating dtypes, since a float-to-integer cast is lossy and undefined out of
// range. Values are not scaled: u8 pixels read as f32 are 0..255.
//
// Every defect is a tandem::Error "[read_idx] <path>: ...": a missing or unreadable file, a bad
// magic or unknown element type, a header cut short, dims whose payload is longer or shorter than
// the file's, a truncated gzip stream, a CRC or other gzip data error.
Tensor read_idx(const std::string& path, Dtype dtype);

}  // namespace tandem::data
