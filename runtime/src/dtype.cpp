// The element types' names (nodal/tensor.hpp; their sizes are inline there). In nodal_core:
// nodalrun's agent names and folds steps of collectives across nodes by dtype too
// (launcher/src/multinode/).
#include <nodal/tensor.hpp>

#include <iterator>

namespace nodal {

/// Indexed by DType's value, in the enum's order.
constexpr std::string_view kDTypeNames[] = {"bool", "u8", "i8", "i32", "i64", "f16", "bf16", "f32", "f64"};
static_assert(std::size(kDTypeNames) == static_cast<std::size_t>(DType::f64) + 1, "one name per DType");

std::string_view dtype_name(DType dtype) noexcept {
  const auto index = static_cast<std::size_t>(dtype);
  return index < std::size(kDTypeNames) ? kDTypeNames[index] : "invalid";  // a value cast from outside the enum
}

}  // namespace nodal
