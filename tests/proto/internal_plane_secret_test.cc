// The group secret helpers: generation (fresh, hex), loading from a file or the environment
// (trailing newline dropped, too short or empty refused, the file winning over the environment),
// the constant-time comparison, and the TLS files' all-or-none rule.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "proto/internal_plane.h"
#include "tests/common/temp_dir.h"

namespace deja::proto {
namespace {

// Sets (or, with nullptr, unsets) the secret's environment variable for one test.
class ScopedEnv {
 public:
  explicit ScopedEnv(const char* value) {
    if (const char* old = std::getenv(kGroupSecretEnv)) {
      old_ = old;
      had_ = true;
    }
    if (value) {
      ::setenv(kGroupSecretEnv, value, 1);
    } else {
      ::unsetenv(kGroupSecretEnv);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(kGroupSecretEnv, old_.c_str(), 1);
    } else {
      ::unsetenv(kGroupSecretEnv);
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(GroupSecretTest, GeneratedSecretsAreFreshHex) {
  StatusOr<std::string> a = GenerateGroupSecret(), b = GenerateGroupSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos) << *a;
  EXPECT_NE(*a, *b);
}

TEST(GroupSecretTest, LoadsFromAFileOrTheEnvironment) {
  test_util::TempDir tmp;
  const std::string file = tmp.File("secret");
  test_util::WriteBytes(file, "0123456789abcdef-from-file\r\n \n");
  {
    ScopedEnv env("0123456789abcdef-from-env\n");
    EXPECT_EQ(*LoadGroupSecret(file), "0123456789abcdef-from-file");
    EXPECT_EQ(*LoadGroupSecret(""), "0123456789abcdef-from-env");
  }
  {
    ScopedEnv env(nullptr);
    EXPECT_EQ(*LoadGroupSecret(""), "");  // neither: the caller decides
  }
  {
    ScopedEnv env("short");
    Status s = LoadGroupSecret("").status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("at least 16"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(kGroupSecretEnv), std::string::npos) << s.ToString();
  }
  test_util::WriteBytes(file, "\n");
  EXPECT_NE(LoadGroupSecret(file).status().message().find("is empty"), std::string::npos);
  EXPECT_NE(LoadGroupSecret(tmp.File("missing")).status().message().find("cannot read"),
            std::string::npos);
}

TEST(GroupSecretTest, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(InternalCredentialsTest, TlsFilesGoTogether) {
  EXPECT_FALSE(InternalCredentials::Load({}).value().tls());
  InternalTlsFiles partial;
  partial.cert_file = "/nonexistent.pem";
  EXPECT_NE(InternalCredentials::Load(partial).status().message().find("go together"),
            std::string::npos);
  InternalTlsFiles name_only;
  name_only.server_name = "deja";
  EXPECT_EQ(InternalCredentials::Load(name_only).status().code(), StatusCode::kInvalidArgument);
  test_util::TempDir tmp;
  test_util::WriteBytes(tmp.File("not.pem"), "hello");
  InternalTlsFiles bad{tmp.File("not.pem"), tmp.File("not.pem"), tmp.File("not.pem"), ""};
  Status s = InternalCredentials::Load(bad).status();
  EXPECT_NE(s.message().find("--internal-tls-cert: cannot read a PEM file"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace deja::proto
