#include "copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace nodal::detail {

void copy_bytes(void* dst, const void* src, std::size_t n, bool stream) {
  if (n == 0 || dst == src) return;
#if defined(__x86_64__)
  if (stream && n >= 256) {
    auto* d = static_cast<char*>(dst);
    auto* s = static_cast<const char*>(src);
    // Head up to the destination's 16-byte alignment with memcpy, then 64 bytes per round.
    std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    std::size_t body = n & ~std::size_t{63};
    for (std::size_t i = 0; i < body; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + body, s + body, n - body);
    _mm_sfence();  // streaming stores are weakly ordered: finish them before any flag store
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace nodal::detail
