// HashStore (in-process) and PrefixStore.
#include "comm/store/kv_map.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/store.h"

namespace paratrain::comm {

struct HashStore::Impl {
  store::KvMap map;
};

static std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ...";
  return s;
}

HashStore::HashStore() : impl_(std::make_unique<Impl>()) {}
HashStore::~HashStore() = default;
void HashStore::set(const std::string& key, const std::string& value) { impl_->map.set(key, value); }
std::string HashStore::get(const std::string& key) {
  wait({key});
  std::string v;
  impl_->map.get(key, &v);
  return v;
}
int64_t HashStore::add(const std::string& key, int64_t delta) { return impl_->map.add(key, delta); }
std::string HashStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return impl_->map.compare_set(key, expected, desired);
}
bool HashStore::check(const std::vector<std::string>& keys) { return impl_->map.check(keys); }
void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (!impl_->map.wait(keys, std::chrono::steady_clock::now() + timeout))
    PT_THROW(TimeoutError, "store: timed out after ", timeout.count(), " ms waiting for keys [", join_keys(keys), "]");
}
bool HashStore::delete_key(const std::string& key) { return impl_->map.erase(key); }
int64_t HashStore::num_keys() { return impl_->map.size(); }

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  timeout_ = base_->timeout();
}
std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& key : keys) out.push_back(k(key));
  return out;
}
void PrefixStore::set(const std::string& key, const std::string& value) { base_->set(k(key), value); }
std::string PrefixStore::get(const std::string& key) { return base_->get(k(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(k(key), delta); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return base_->compare_set(k(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(k(keys)); }
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(k(keys), timeout);
}
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(k(key)); }
int64_t PrefixStore::num_keys() { return base_->num_keys(); }

}  // namespace paratrain::comm
