#include "transport/registry.hpp"

#include <array>

namespace ferry::transport {

// Declared here, defined in each transport's folder (entry.cpp). An explicit table, not
// self-registering objects: the linker drops objects of a static library that nothing names.
#define FERRY_TRANSPORT(folder) const TransportEntry& folder##_entry();
#include "transport/transports.def"
#undef FERRY_TRANSPORT

std::span<const TransportEntry* const> registered_transports() {
  static const auto table = std::to_array<const TransportEntry*>({
#define FERRY_TRANSPORT(folder) &folder##_entry(),
#include "transport/transports.def"
#undef FERRY_TRANSPORT
  });
  return table;
}

const TransportEntry* find_transport(TransportKind kind) {
  for (const TransportEntry* e : registered_transports()) {
    if (e->kind == kind) return e;
  }
  return nullptr;
}

}  // namespace ferry::transport

namespace ferry {

std::string_view to_string(TransportKind kind) noexcept {
  if (const transport::TransportEntry* entry = transport::find_transport(kind)) return entry->name;
  return "unknown";
}

std::optional<TransportKind> transport_named(std::string_view name) noexcept {
  for (const transport::TransportEntry* e : transport::registered_transports()) {
    if (e->name == name) return e->kind;
  }
  return std::nullopt;
}

}  // namespace ferry
