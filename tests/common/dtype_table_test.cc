// The dtype table: one row per DType in enum order, each spelling unique, and DTypeName and the
// safetensors spelling read from it.
#include "common/dtype_table.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/safetensors.h"

namespace deja {
namespace {

TEST(DTypeTableTest, OneRowPerDTypeWithUniqueSpellings) {
  std::set<std::string> names, safetensors;
  int i = 0;
  for (const DTypeRow& row : DTypeTable()) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(static_cast<int>(row.dtype), i++);
    EXPECT_EQ(&DTypeOf(row.dtype), &row);
    EXPECT_STREQ(DTypeName(row.dtype), row.name);
    EXPECT_STREQ(SafetensorsDTypeName(row.dtype), row.safetensors);
    EXPECT_TRUE(names.insert(row.name).second);
    EXPECT_TRUE(safetensors.insert(row.safetensors).second);
  }
  // kU8 is the last DType: a value added after it needs a row.
  EXPECT_EQ(i, static_cast<int>(DType::kU8) + 1);
}

}  // namespace
}  // namespace deja
