#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace tandem::data {

namespace {

struct ElementType {
  uint8_t code;
  const char* name;
  size_t size;
  bool floating;
};

constexpr ElementType kTypes[] = {{0x08, "u8", 1, false},  {0x09, "i8", 1, false},  {0x0B, "i16", 2, false},
                                  {0x0C, "i32", 4, false}, {0x0D, "f32", 4, true}, {0x0E, "f64", 8, true}};

const ElementType* find_type(uint8_t code) {
  for (const ElementType& t : kTypes)
    if (t.code == code) return &t;
  return nullptr;
}

// gzopen reads a file that is not gzipped as it is ("transparent" mode), so one path serves both.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (!file_) fail("[read_idx] {}: cannot open: {}", path, errno ? std::strerror(errno) : "out of memory");
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes and returns how many it got: fewer only at a clean end of file. A
  // truncated stream, a CRC mismatch or a read error throws.
  size_t read(void* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, size_t{1} << 30));
      const int r = gzread(file_, static_cast<char*>(dst) + got, chunk);
      if (r > 0) got += static_cast<size_t>(r);
      if (r == static_cast<int>(chunk)) continue;
      int code = Z_OK;
      const char* msg = gzerror(file_, &code);
      if (code == Z_OK) break;  // end of file after a complete stream (or of a plain file)
      // No byte offsets in these messages: zlib inflates ahead of what was asked, so it may find
      // the damage before handing over bytes that precede it.
      switch (code) {
        case Z_BUF_ERROR:
          fail("[read_idx] {}: truncated gzip stream (the file ends inside it)", path_);
        case Z_ERRNO:
          fail("[read_idx] {}: read error: {}", path_, std::strerror(errno));
        case Z_DATA_ERROR:
          fail("[read_idx] {}: corrupt gzip data: {}", path_, explain(msg));
        default:
          fail("[read_idx] {}: gzip error {}: {}", path_, code, explain(msg));
      }
    }
    return got;
  }

 private:
  // zlib prefixes its messages with the path, which ours already name; and its wording for the
  // two trailer checks is obscure.
  std::string explain(const char* msg) const {
    std::string m = msg ? msg : "";
    const std::string prefix = path_ + ": ";
    if (m.rfind(prefix, 0) == 0) m.erase(0, prefix.size());
    if (m == "incorrect data check") return "CRC-32 mismatch (incorrect data check)";
    if (m == "incorrect length check") return "uncompressed length mismatch (incorrect length check)";
    return m;
  }

  std::string path_;
  gzFile file_ = nullptr;
};

template <class S> S load_big_endian(const uint8_t* p) {
  using U = std::conditional_t<sizeof(S) == 1, uint8_t,
                               std::conditional_t<sizeof(S) == 2, uint16_t,
                                                  std::conditional_t<sizeof(S) == 4, uint32_t, uint64_t>>>;
  U u = 0;
  for (size_t i = 0; i < sizeof(S); ++i) u = static_cast<U>((u << 8) | p[i]);  // compiles to one bswap
  return std::bit_cast<S>(u);
}

template <class D, class S> D convert_element(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != 0;
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

template <class S> void convert_payload(const uint8_t* src, const Tensor& out) {
  TANDEM_DISPATCH_ALL(out.dtype(), "read_idx", [&] {
    scalar_t* dst = static_cast<scalar_t*>(out.data_ptr());
    const int64_t n = out.numel();
    if constexpr (std::is_floating_point_v<S> && !is_floating(dtype_v<scalar_t>)) {
      fail("[read_idx] internal: float elements into {}", out.dtype());  // refused before reading
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = convert_element<scalar_t>(load_big_endian<S>(src + i * sizeof(S)));
    }
  });
}

}  // namespace

Tensor read_idx(const std::string& path, Dtype dtype) {
  GzReader in(path);
  uint8_t magic[4];
  const size_t got_magic = in.read(magic, 4);
  TANDEM_CHECK(got_magic == 4, "[read_idx] {}: file ends inside the header ({} of the 4 magic bytes)", path, got_magic);
  TANDEM_CHECK(magic[0] == 0 && magic[1] == 0,
               "[read_idx] {}: not an IDX file: magic bytes {:02x} {:02x} {:02x} {:02x}, expected 00 00 <type> <dims>",
               path, magic[0], magic[1], magic[2], magic[3]);
  const ElementType* type = find_type(magic[2]);
  TANDEM_CHECK(type != nullptr,
               "[read_idx] {}: unknown IDX element type 0x{:02x} (known: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, "
               "0x0D f32, 0x0E f64)",
               path, magic[2]);
  TANDEM_CHECK(!type->floating || is_floating(dtype),
               "[read_idx] {}: {} elements cannot be read as {} (float-to-integer conversion is lossy); ask for a "
               "floating dtype",
               path, type->name, dtype);

  const int ndim = magic[3];
  std::vector<uint8_t> dim_bytes(4 * static_cast<size_t>(ndim));
  const size_t got_dims = in.read(dim_bytes.data(), dim_bytes.size());
  TANDEM_CHECK(got_dims == dim_bytes.size(), "[read_idx] {}: file ends inside the header ({} of the {} bytes of {} dims)",
               path, got_dims, dim_bytes.size(), ndim);
  Shape shape;
  uint64_t count = 1;
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) {
    const uint32_t size = load_big_endian<uint32_t>(dim_bytes.data() + 4 * d);
    shape.push_back(size);
    overflow = overflow || (size != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / size);
    count *= size;
  }
  TANDEM_CHECK(!overflow, "[read_idx] {}: dims {} are too large to be real", path, shape);
  const size_t need = count * type->size;

  // The dims are not trusted with an allocation: the payload is read into a buffer that doubles
  // from 1 MiB, so a corrupt header claiming terabytes fails at the file's real end, having
  // allocated (and zeroed) about twice what the file holds, not what it claims.
  std::vector<uint8_t> payload(std::min<size_t>(need, size_t{1} << 20));
  size_t have = in.read(payload.data(), payload.size());
  while (have == payload.size() && have < need) {
    payload.resize(std::min(need, payload.size() * 2));
    have += in.read(payload.data() + have, payload.size() - have);
  }
  TANDEM_CHECK(have == need, "[read_idx] {}: payload too short: dims {} of {} need {} bytes, the file has {}", path,
               shape, type->name, need, have);
  // Reading on to the end of the file is what makes zlib check the CRC; it also finds a payload
  // longer than the dims say.
  uint8_t extra[64];
  const size_t trailing = in.read(extra, sizeof extra);
  TANDEM_CHECK(trailing == 0, "[read_idx] {}: payload too long: dims {} of {} need {} bytes, the file has more", path,
               shape, type->name, need);

  Tensor out = make_empty(shape, dtype, kCPU, "read_idx");
  switch (type->code) {
    case 0x08: convert_payload<uint8_t>(payload.data(), out); break;
    case 0x09: convert_payload<int8_t>(payload.data(), out); break;
    case 0x0B: convert_payload<int16_t>(payload.data(), out); break;
    case 0x0C: convert_payload<int32_t>(payload.data(), out); break;
    case 0x0D: convert_payload<float>(payload.data(), out); break;
    case 0x0E: convert_payload<double>(payload.data(), out); break;
  }
  return out;
}

}  // namespace tandem::data
