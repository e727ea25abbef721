#include "worker/prefix/prefix_store.h"

#include <chrono>
#include <string>
#include <utility>

namespace deja::worker::prefix {
namespace {

std::string Name(uint64_t id) { return "prefix block " + std::to_string(id); }

}  // namespace

PrefixStore::PrefixStore(std::shared_ptr<kv::KvBlockPool> pool, std::unique_ptr<BlockFiles> files)
    : pool_(std::move(pool)), files_(std::move(files)) {}

PrefixStore::~PrefixStore() {
  for (auto& [id, b] : blocks_) ReleaseMemory(&b);
}

StatusOr<PrefixStore::Block*> PrefixStore::Find(uint64_t id) {
  auto it = blocks_.find(id);
  if (it == blocks_.end()) return NotFound(Name(id) + " is not cached on this worker");
  return &it->second;
}

void PrefixStore::ReleaseMemory(Block* b) {
  if (b->pool_block < 0) return;
  pool_->Give({b->pool_block});
  b->pool_block = -1;
  --in_memory_;
}

Status PrefixStore::Insert(uint64_t id, int32_t pool_block, std::vector<int32_t> tokens) {
  if (blocks_.count(id)) {
    return Status(StatusCode::kAlreadyExists, Name(id) + " is already cached");
  }
  if (pool_->holders(pool_block) <= 0) {
    return InvalidArgument(Name(id) + ": pool block " + std::to_string(pool_block) + " is free");
  }
  Block b;
  if (files_ != nullptr) {
    auto bytes = std::make_shared<std::vector<char>>(static_cast<size_t>(pool_->block_bytes()));
    DEJA_RETURN_IF_ERROR(pool_->CopyOut(pool_block, bytes->data()));
    files_->Write(id, std::move(bytes));
    b.on_disk = true;
  }
  pool_->Retain(pool_block);
  b.pool_block = pool_block;
  b.tokens = std::move(tokens);
  blocks_.emplace(id, std::move(b));
  ++in_memory_;
  return Status::Ok();
}

Status PrefixStore::ToHost(uint64_t id) {
  DEJA_ASSIGN_OR_RETURN(Block * b, Find(id));
  if (b->pool_block < 0) return FailedPrecondition(Name(id) + " is not in memory");
  auto bytes = std::make_shared<std::vector<char>>(static_cast<size_t>(pool_->block_bytes()));
  DEJA_RETURN_IF_ERROR(pool_->CopyOut(b->pool_block, bytes->data()));
  ReleaseMemory(b);
  b->host = std::move(bytes);
  ++on_host_;
  return Status::Ok();
}

Status PrefixStore::ToDisk(uint64_t id) {
  DEJA_ASSIGN_OR_RETURN(Block * b, Find(id));
  if (!b->on_disk) return FailedPrecondition(Name(id) + " has no disk copy");
  ReleaseMemory(b);
  if (b->host != nullptr) {
    b->host.reset();
    --on_host_;
  }
  return Status::Ok();
}

Status PrefixStore::ToMemory(uint64_t id, PrefixIo* io) {
  DEJA_ASSIGN_OR_RETURN(Block * b, Find(id));
  if (b->pool_block >= 0) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> taken;
  DEJA_RETURN_IF_ERROR(pool_->Take(1, &taken));
  Status st;
  if (b->host != nullptr) {
    st = pool_->CopyIn(taken[0], b->host->data());
    if (st.ok()) io->host_bytes += pool_->block_bytes();
  } else if (b->on_disk) {
    std::vector<char> bytes(static_cast<size_t>(pool_->block_bytes()));
    st = files_->Read(id, bytes.data(), bytes.size());
    if (st.ok()) st = pool_->CopyIn(taken[0], bytes.data());
    if (st.ok()) io->disk_bytes += pool_->block_bytes();
    if (!st.ok() && st.code() != StatusCode::kResourceExhausted) Drop(id);  // lost: never serve it
  } else {
    st = Internal(Name(id) + " has no copy");
  }
  io->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) {
    pool_->Give(taken);
    return st;
  }
  auto it = blocks_.find(id);  // still there: Drop runs only on failure
  it->second.pool_block = taken[0];
  ++in_memory_;
  if (it->second.host != nullptr) {
    it->second.host.reset();
    --on_host_;
  }
  return Status::Ok();
}

void PrefixStore::Drop(uint64_t id) {
  auto it = blocks_.find(id);
  if (it == blocks_.end()) return;
  ReleaseMemory(&it->second);
  if (it->second.host != nullptr) --on_host_;
  if (it->second.on_disk) files_->Remove(id);
  blocks_.erase(it);
}

Status PrefixStore::SeedLazy(const std::vector<uint64_t>& ids, kv::SequenceKv* kv,
                             std::vector<int32_t>* tokens) {
  std::vector<int32_t> copy(ids.size(), -1);
  std::vector<std::optional<LazySource>> sources(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = blocks_.find(ids[i]);
    if (it == blocks_.end()) return NotFound(Name(ids[i]) + " is not cached on this worker");
    const Block& b = it->second;
    if (b.pool_block >= 0) {
      copy[i] = b.pool_block;
    } else if (b.host != nullptr || b.on_disk) {
      sources[i] = LazySource{ids[i], b.host};
    } else {
      return Internal(Name(ids[i]) + " has no copy");
    }
  }
  DEJA_RETURN_IF_ERROR(kv->SeedLoadedPrefix(
      copy, std::make_unique<LazyPrefix>(pool_, files_, ids, std::move(sources), lazy_)));
  for (uint64_t id : ids) {
    const std::vector<int32_t>& t = blocks_.at(id).tokens;
    tokens->insert(tokens->end(), t.begin(), t.end());
  }
  return Status::Ok();
}

LazyCounters PrefixStore::TakeLazy() {
  LazyCounters out = std::move(*lazy_);
  *lazy_ = LazyCounters();
  for (uint64_t id : out.failed) Drop(id);
  return out;
}

Status PrefixStore::MemoryBlocks(const std::vector<uint64_t>& ids, std::vector<int32_t>* blocks,
                                 std::vector<int32_t>* tokens) const {
  for (uint64_t id : ids) {
    auto it = blocks_.find(id);
    if (it == blocks_.end() || it->second.pool_block < 0) {
      return FailedPrecondition(Name(id) + " is not in this worker's memory");
    }
    blocks->push_back(it->second.pool_block);
    tokens->insert(tokens->end(), it->second.tokens.begin(), it->second.tokens.end());
  }
  return Status::Ok();
}

}  // namespace deja::worker::prefix
