// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}}
// padded with spaces to a multiple of 8, then the tensors' bytes (contiguous, little-endian),
// offsets relative to the start of that buffer. Dtypes: F32 F64 F16 BF16 I32 I64 BOOL.
//
// Loading validates the whole file (sizes, JSON, dtypes, shapes against byte counts, offsets that
// must tile the buffer exactly) and throws tandem::Error "[safetensors] ..." on any problem;
// saving writes "<path>.tmp.<pid>", fsyncs it and renames it over `path`, so a crash never
// leaves a half-written file under the real name.
#pragma once

#include <map>
#include <string>

#include "nn/module.h"
#include "nn/optim.h"

namespace tandem::nn {

using Metadata = std::map<std::string, std::string>;

// Tensors may live on any device and have any strides (they are copied); names must be
// non-empty and not "__metadata__". Data are laid out by decreasing element size, then by
// name, as the reference implementation does, so every tensor is naturally aligned.
void save_safetensors(const std::string& path, const TensorDict& tensors, const Metadata& metadata = {});
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const Metadata& metadata = {});

// Tensors in file (offset) order, on the CPU; the metadata goes to `metadata` when given.
TensorDict load_safetensors(const std::string& path, Metadata* metadata = nullptr);

// Parses a whole file image in memory (what load_safetensors does after reading the file);
// `what` names the source in errors.
TensorDict parse_safetensors(const void* data, size_t size, Metadata* metadata = nullptr,
                             const std::string& what = "buffer");

// A module's state_dict to a file and back (load_state_dict(strict) semantics).
void save_model(const Module& module, const std::string& path, const Metadata& metadata = {});
LoadStateDictResult load_model(Module& module, const std::string& path, bool strict = true);

// An optimizer's state_dict to a file and back.
void save_optimizer(const optim::Optimizer& optimizer, const std::string& path, const Metadata& metadata = {});
void load_optimizer(optim::Optimizer& optimizer, const std::string& path);

}  // namespace tandem::nn
