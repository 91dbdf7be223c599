// The element types' sizes and names (nodal/tensor.hpp). In nodal_core: nodalrun's agent folds
// steps of collectives across nodes by dtype too (launcher/src/multinode/folded_step.cpp).
#include <nodal/tensor.hpp>

#include <iterator>

namespace nodal {
namespace {

struct DTypeInfo {
  std::size_t size;
  std::string_view name;
};

/// Indexed by DType's value, in the enum's order.
constexpr DTypeInfo kDTypes[] = {{1, "bool"}, {1, "u8"},   {1, "i8"},  {4, "i32"}, {8, "i64"},
                                 {2, "f16"},  {2, "bf16"}, {4, "f32"}, {8, "f64"}};
static_assert(std::size(kDTypes) == static_cast<std::size_t>(DType::f64) + 1, "one entry per DType");

constexpr DTypeInfo info(DType dtype) noexcept {
  auto index = static_cast<std::size_t>(dtype);
  // A value cast from outside the enum has no entry.
  return index < std::size(kDTypes) ? kDTypes[index] : DTypeInfo{0, "invalid"};
}

}  // namespace

std::size_t element_size(DType dtype) noexcept { return info(dtype).size; }
std::string_view dtype_name(DType dtype) noexcept { return info(dtype).name; }

}  // namespace nodal
