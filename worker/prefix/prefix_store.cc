#include "worker/prefix/prefix_store.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <utility>

namespace deja::worker::prefix {
namespace {

std::string Name(uint64_t id) { return "prefix block " + std::to_string(id); }

}  // namespace

PrefixStore::PrefixStore(std::shared_ptr<kv::KvBlockPool> pool, std::unique_ptr<BlockFiles> files,
                         bool reorder_files)
    : pool_(std::move(pool)),
      files_(std::move(files)),
      layout_(OrderedLayout::Of(*pool_)),
      reorder_files_(reorder_files && files_ != nullptr) {
  if (reorder_files_) reorderer_ = std::thread([this] { ReorderLoop(); });
}

PrefixStore::~PrefixStore() {
  {
    std::lock_guard<std::mutex> lock(reorder_mu_);
    stop_ = true;
  }
  reorder_cv_.notify_all();
  if (reorderer_.joinable()) reorderer_.join();
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
    std::vector<char> bytes(static_cast<size_t>(pool_->block_bytes()));
    DEJA_RETURN_IF_ERROR(pool_->CopyOut(pool_block, bytes.data()));
    auto order = std::make_shared<const std::vector<int32_t>>(layout_.PositionOrder());
    auto file = std::make_shared<std::vector<char>>(static_cast<size_t>(layout_.file_bytes()));
    layout_.Encode(bytes.data(), *order, file->data());
    files_->Write(id, std::move(file));
    b.on_disk = true;
    b.order = std::move(order);
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
    std::vector<char> file(static_cast<size_t>(layout_.file_bytes()));
    std::vector<char> bytes(static_cast<size_t>(pool_->block_bytes()));
    st = files_->Read(id, file.data(), file.size(), &io->disk_bytes);
    if (st.ok()) st = layout_.Decode(file.data(), bytes.data());
    if (st.ok()) st = pool_->CopyIn(taken[0], bytes.data());
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
      sources[i] = LazySource{ids[i], b.host, b.order};
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
  if (!reorder_files_) return out;
  PublishReorders();
  for (const auto& [id, counts] : out.chosen_slots) {
    auto it = blocks_.find(id);
    if (it == blocks_.end() || !it->second.on_disk) continue;
    Block& b = it->second;
    b.chosen.resize(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) b.chosen[i] += static_cast<float>(counts[i]);
    if (b.reordering) continue;
    std::shared_ptr<const std::vector<int32_t>> to = NewOrder(b);
    if (to == nullptr) continue;
    b.reordering = true;
    {
      std::lock_guard<std::mutex> lock(reorder_mu_);
      queued_.push_back(Reorder{id, b.host, b.order, std::move(to), nullptr, Status::Ok()});
      ++reordering_;
    }
    reorder_cv_.notify_all();
  }
  return out;
}

std::shared_ptr<const std::vector<int32_t>> PrefixStore::NewOrder(const Block& b) const {
  const int32_t bs = layout_.block_slots();
  const int32_t rows = layout_.group_rows();
  std::vector<int32_t> order = *b.order;
  std::vector<int32_t> old_group(static_cast<size_t>(bs));
  int64_t moved = 0, counted = 0;
  for (int32_t l = 0; l < layout_.layers(); ++l) {
    const float* c = b.chosen.data() + static_cast<int64_t>(l) * bs;
    if (std::all_of(c, c + bs, [](float x) { return x == 0.f; })) continue;
    int32_t* o = order.data() + static_cast<int64_t>(l) * bs;
    for (int32_t r = 0; r < bs; ++r) old_group[o[r]] = r / rows;
    std::iota(o, o + bs, 0);
    std::stable_sort(o, o + bs, [c](int32_t a, int32_t z) { return c[a] > c[z]; });
    for (int32_t r = 0; r < bs; ++r) moved += old_group[o[r]] != r / rows;
    counted += bs;
  }
  // A rewrite costs the whole file: worth it when at least an eighth of the counted slots
  // change group (the first time, from position order, most do).
  if (counted == 0 || moved * 8 < counted) return nullptr;
  return std::make_shared<const std::vector<int32_t>>(std::move(order));
}

void PrefixStore::ReorderLoop() {
  std::vector<char> file, pool;
  std::vector<int32_t> order;
  for (;;) {
    Reorder job;
    {
      std::unique_lock<std::mutex> lock(reorder_mu_);
      reorder_cv_.wait(lock, [&] { return stop_ || !queued_.empty(); });
      if (stop_) return;
      job = std::move(queued_.front());
      queued_.pop_front();
    }
    job.file = std::make_shared<std::vector<char>>(static_cast<size_t>(layout_.file_bytes()));
    if (job.host != nullptr) {
      layout_.Encode(job.host->data(), *job.to, job.file->data());
    } else {
      file.resize(static_cast<size_t>(layout_.file_bytes()));
      pool.resize(static_cast<size_t>(layout_.pool_bytes()));
      job.status = files_->Read(job.id, file.data(), file.size());
      if (job.status.ok()) job.status = layout_.Decode(file.data(), pool.data(), &order);
      if (job.status.ok() && order != *job.from) {
        job.status = FailedPrecondition(Name(job.id) + "'s file is not in the order expected");
      }
      if (job.status.ok()) layout_.Encode(pool.data(), *job.to, job.file->data());
    }
    {
      std::lock_guard<std::mutex> lock(reorder_mu_);
      done_.push_back(std::move(job));
      --reordering_;
    }
    reorder_cv_.notify_all();
  }
}

void PrefixStore::PublishReorders() {
  std::vector<Reorder> ready = std::move(waiting_);
  waiting_.clear();
  {
    std::lock_guard<std::mutex> lock(reorder_mu_);
    for (Reorder& r : done_) ready.push_back(std::move(r));
    done_.clear();
  }
  for (Reorder& r : ready) {
    auto it = blocks_.find(r.id);
    // Dropped, or another block under that id since.
    if (it == blocks_.end() || it->second.order != r.from) continue;
    Block& b = it->second;
    if (!r.status.ok()) {
      // The next load that reads it finds what is wrong; until then it keeps its order.
      LOG(WARNING) << "not reordering " << Name(r.id) << ": " << r.status.message();
      b.reordering = false;
      continue;
    }
    if (b.order.use_count() > 2) {
      // Held by more than the block and this job: a sequence seeded from the file reads it in
      // its next step, in the old order.
      waiting_.push_back(std::move(r));
      continue;
    }
    // Reads of the block see the new payload from here on (BlockFiles serves a queued write
    // from its buffer), so the order and the bytes change together.
    files_->Write(r.id, std::move(r.file));
    b.order = std::move(r.to);
    b.reordering = false;
    ++reordered_;
  }
}

void PrefixStore::FinishReorders() {
  if (!reorder_files_) return;
  {
    std::unique_lock<std::mutex> lock(reorder_mu_);
    reorder_cv_.wait(lock, [&] { return reordering_ == 0; });
  }
  PublishReorders();
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
