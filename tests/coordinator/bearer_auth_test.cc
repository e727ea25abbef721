// Bearer tokens: the token file's format (comments, blank lines, whitespace, errors naming the
// flag without echoing a token) and the check of an authorization value.
#include <gtest/gtest.h>

#include "coordinator/security.h"
#include "tests/common/temp_dir.h"

namespace deja::coordinator {
namespace {

TEST(BearerAuthTest, AcceptsExactlyTheTokensInTheBearerScheme) {
  const BearerAuth auth({"alpha-1", "beta/2+=="});
  for (const char* ok :
       {"Bearer alpha-1", "bearer alpha-1", "BEARER beta/2+==", "Bearer  alpha-1 "}) {
    EXPECT_TRUE(auth.Allows(ok)) << ok;
  }
  for (const char* bad :
       {"", "Bearer", "Bearer ", "alpha-1", "Basic alpha-1", "Bearer alpha-", "Bearer alpha-12",
        "Bearer ALPHA-1", "Bearer beta/2+=", "Beareralpha-1", "Bearer alpha-1 beta/2+=="}) {
    EXPECT_FALSE(auth.Allows(bad)) << bad;
  }
}

TEST(BearerAuthTest, MetadataWithoutAnAcceptedTokenIsUnauthenticated) {
  const BearerAuth auth({"alpha-1"});
  std::multimap<grpc::string_ref, grpc::string_ref> md;
  Status s = auth.Check(md);
  EXPECT_EQ(s.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(s.message().find("authorization: Bearer"), std::string::npos) << s.message();
  md.emplace("authorization", "Bearer secret-guess");
  s = auth.Check(md);
  EXPECT_EQ(s.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(s.message().find("secret-guess"), std::string::npos) << s.message();
  md.clear();
  md.emplace("authorization", "Bearer alpha-1");
  EXPECT_TRUE(auth.Check(md).ok());
}

TEST(TokenFileTest, OneTokenPerLineSkippingCommentsAndBlankLines) {
  test_util::TempDir dir;
  const std::string path = dir.File("tokens");
  test_util::WriteBytes(path, "# service tokens\n\n  first \r\n\t# indented comment\nsecond\n\n");
  StatusOr<std::vector<std::string>> tokens = ReadTokenFile(path, "--auth-token-file");
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, (std::vector<std::string>{"first", "second"}));
  test_util::WriteBytes(path, "last-without-newline");
  tokens = ReadTokenFile(path, "--auth-token-file");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, std::vector<std::string>{"last-without-newline"});
}

TEST(TokenFileTest, ErrorsNameTheFlagAndNeverTheToken) {
  test_util::TempDir dir;
  const std::string path = dir.File("tokens");
  auto error = [&](const std::string& contents) {
    test_util::WriteBytes(path, contents);
    return ReadTokenFile(path, "--auth-token-file").status();
  };
  Status s = error("# only a comment\n\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--auth-token-file: " + path + " holds no token");
  s = error("good\nsecret part\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--auth-token-file: line 2 of " + path), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("secret"), std::string::npos) << s.message();
  EXPECT_EQ(error("tok\x01"
                  "en\n")
                .code(),
            StatusCode::kInvalidArgument);
  s = ReadTokenFile(dir.File("missing"), "--auth-token-file").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("--auth-token-file: ", 0), 0u) << s.message();
  s = ReadTokenFile(dir.path(), "--auth-token-file").status();  // a directory
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deja::coordinator
