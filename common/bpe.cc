// The merge loop follows HF tokenizers' Word::merge_all (lowest rank first, leftmost among
// equal ranks, stale queue entries skipped), which keeps long pieces O(n log n).
#include "common/bpe.h"

#include <cstdio>
#include <functional>
#include <mutex>
#include <queue>

#include "common/utf8.h"

namespace deja {
namespace {

std::array<uint32_t, 256> BuildByteTable() {
  // Printable Latin-1 bytes stand for themselves; the rest are shifted to U+0100 and up, in
  // byte order, so that no token contains whitespace or control characters.
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? b : next++;
  }
  return table;
}

const std::unordered_map<uint32_t, uint8_t>& CodePointToByte() {
  static const std::unordered_map<uint32_t, uint8_t> map = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    const auto& table = ByteToCodePoint();
    for (int b = 0; b < 256; ++b) m[table[b]] = static_cast<uint8_t>(b);
    return m;
  }();
  return map;
}

}  // namespace

const std::array<uint32_t, 256>& ByteToCodePoint() {
  static const std::array<uint32_t, 256> table = BuildByteTable();
  return table;
}

std::string ByteLevelTokenBytes(std::string_view token) {
  const auto& to_byte = CodePointToByte();
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    uint32_t cp;
    size_t n = DecodeUtf8Char(token, pos, &cp);
    auto it = n == 0 ? to_byte.end() : to_byte.find(cp);
    if (it == to_byte.end()) return std::string(token);
    bytes.push_back(static_cast<char>(it->second));
    pos += n;
  }
  return bytes;
}

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const std::unordered_map<std::string, int32_t>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  const auto& table = ByteToCodePoint();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(table[b], &ch);
    auto it = vocab.find(ch);
    if (it == vocab.end()) {
      char hex[8];
      snprintf(hex, sizeof(hex), "0x%02X", b);
      return DataLoss(std::string("vocab.json has no token for byte ") + hex + " (\"" + ch +
                      "\"): not a byte-level BPE vocabulary");
    }
    model->byte_ids_[b] = it->second;
  }
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab.find(left);
    auto r = vocab.find(right);
    auto m = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || m == vocab.end()) {
      const std::string missing = l == vocab.end() ? left : r == vocab.end() ? right : left + right;
      return DataLoss("merges.txt: merge " + std::to_string(rank + 1) + " (\"" + left + " " +
                      right + "\") uses \"" + missing + "\", which is not in vocab.json");
    }
    // A repeated merge keeps its later rank, as in HF and in GPT-2's dict(zip(merges, ...)).
    model->merges_[PairKey(l->second, r->second)] = {static_cast<int32_t>(rank), m->second};
  }
  return model;
}

void BpeModel::EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mu_);
    auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> out;
  MergeBytes(piece, &out);
  ids->insert(ids->end(), out.begin(), out.end());
  if (cacheable) {
    std::unique_lock lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(piece), std::move(out));
  }
}

void BpeModel::MergeBytes(std::string_view piece, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the left symbol
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t left) {
    int32_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // The pair at this position may have changed since the entry was queued.
    auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    Symbol& right = symbols[left.next];
    right.alive = false;
    left.id = top.new_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace deja
