#include "worker/comm/key_value_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace deja::worker::comm {
namespace {

using Clock = std::chrono::steady_clock;

class InMemoryStore final : public KeyValueStore {
 public:
  Status Set(const std::string& key, std::string_view value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = std::string(value);
    }
    cv_.notify_all();
    return Status::Ok();
  }

  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
      return KeyTimeout(key, timeout);
    }
    return values_.at(key);
  }

  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mu_);
    for (const std::string& key : keys) {
      if (!cv_.wait_until(lock, deadline, [&] { return values_.count(key) > 0; })) {
        return KeyTimeout(key, timeout);
      }
    }
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// Keys may hold any bytes ('/' included); file names are their hex spelling.
std::string HexName(const std::string& key) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out = "k_";
  for (unsigned char c : key) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

class FileStore final : public KeyValueStore {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  Status Set(const std::string& key, std::string_view value) override {
    const std::string final_path = Path(key);
    std::ostringstream tmp;
    tmp << dir_ << "/.tmp_" << ::getpid() << "_" << std::this_thread::get_id() << "_"
        << counter_.fetch_add(1);
    {
      std::ofstream out(tmp.str(), std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      out.flush();
      if (!out.good()) return Unavailable("file store: cannot write " + tmp.str());
    }
    std::error_code ec;
    std::filesystem::rename(tmp.str(), final_path, ec);
    if (ec) {
      std::filesystem::remove(tmp.str(), ec);
      return Unavailable("file store: cannot rename to " + final_path + ": " + ec.message());
    }
    return Status::Ok();
  }

  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    DEJA_RETURN_IF_ERROR(Wait({key}, timeout));
    std::ifstream in(Path(key), std::ios::binary);
    if (!in.good()) return Unavailable("file store: cannot read key " + key + " in " + dir_);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      // Poll with a growing sleep: fast when the peer is already there, cheap when it is not.
      std::chrono::microseconds sleep(200);
      while (!std::filesystem::exists(Path(key))) {
        if (Clock::now() >= deadline) return KeyTimeout(key, timeout);
        std::this_thread::sleep_for(sleep);
        sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::milliseconds(20));
      }
    }
    return Status::Ok();
  }

 private:
  std::string Path(const std::string& key) const { return dir_ + "/" + HexName(key); }

  std::string dir_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace

Status KeyTimeout(const std::string& key, std::chrono::milliseconds timeout) {
  return Status(StatusCode::kDeadlineExceeded, "rendezvous key '" + key + "' not set within " +
                                                   std::to_string(timeout.count()) + " ms");
}

std::unique_ptr<KeyValueStore> MakeInMemoryStore() { return std::make_unique<InMemoryStore>(); }

StatusOr<std::unique_ptr<KeyValueStore>> MakeFileStore(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return Unavailable("file store: cannot create directory " + dir + ": " + ec.message());
  }
  return std::unique_ptr<KeyValueStore>(std::make_unique<FileStore>(dir));
}

}  // namespace deja::worker::comm
