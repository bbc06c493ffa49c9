// The PrivateUse1 slot: one out-of-tree provider per process registers its
// name and default autocast dtype here. Registration touches no hardware; the
// provider's runtime initialises on first use.
#pragma once

#include <string>

#include "infinitrain/dtype.h"

namespace infinitrain {

struct PrivateUse1Info {
    std::string name;
    DataType autocast_dtype = DataType::kBFloat16;  // kFloat16 or kBFloat16
};

// Idempotent for the same name and info; a different provider in the same
// process raises std::runtime_error naming both. Thread-safe.
void RegisterPrivateUse1(const PrivateUse1Info& info);
// Raises what RegisterPrivateUse1 would raise, without registering.
void CheckPrivateUse1(const PrivateUse1Info& info);
// Null when no provider registered.
const PrivateUse1Info* GetPrivateUse1();

}  // namespace infinitrain
