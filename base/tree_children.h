// The children of a node in a tree that users may build arbitrarily deep in memory (the IR's
// blocks and statements, adstack size expressions): a std::vector whose copy and destruction
// use an explicit work list instead of recursion, so a 10^6-level tree is copied and freed in
// constant stack depth (the verifier refuses such a tree later, but it must be able to say so).
//
// `Node` must provide, found by argument-dependent lookup:
//   void detach_children(Node& n, std::vector<TreeChildren<Node>>& out);
// which moves every TreeChildren<Node> held by `n` (directly or through intermediate
// structures) into `out`, leaving them empty.
//
// Copying: the outermost copy on a thread copies one level at a time; the copies of nested
// TreeChildren it makes (through Node's ordinary copy constructor) start empty and register
// themselves, with their source, on the thread's work list, which the outermost copy drains.
// Their addresses are stable because each level is reserved before its elements are copied.
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

namespace vkad {

template <typename Node>
class TreeChildren : public std::vector<Node> {
  using Base = std::vector<Node>;

 public:
  using Base::Base;
  TreeChildren() = default;
  TreeChildren(Base&& v) noexcept : Base(std::move(v)) {}
  TreeChildren(const Base& v) : Base() { copy_from(v); }
  TreeChildren(TreeChildren&&) noexcept = default;
  TreeChildren(const TreeChildren& o) : Base() { copy_from(o); }
  TreeChildren& operator=(TreeChildren&& o) noexcept {
    if (this != &o) {
      TreeChildren old(std::move(*static_cast<Base*>(this)));  // freed iteratively below
      Base::operator=(std::move(static_cast<Base&>(o)));
    }
    return *this;
  }
  TreeChildren& operator=(const TreeChildren& o) {
    if (this != &o) {
      TreeChildren copy(o);
      *this = std::move(copy);
    }
    return *this;
  }
  TreeChildren& operator=(Base&& v) noexcept { return *this = TreeChildren(std::move(v)); }
  TreeChildren& operator=(const Base& v) { return *this = TreeChildren(v); }
  TreeChildren& operator=(std::initializer_list<Node> l) { return *this = TreeChildren(l); }

  ~TreeChildren() {
    if (this->empty()) return;
    std::vector<TreeChildren> work;
    for (Node& n : *this) detach_children(n, work);
    while (!work.empty()) {
      TreeChildren level = std::move(work.back());
      work.pop_back();
      for (Node& n : level) detach_children(n, work);
      // `level` is destroyed here with no grandchildren left: one frame deep.
    }
  }

 private:
  struct CopyWork {
    bool active = false;
    std::vector<std::pair<TreeChildren*, const Base*>> pending;
  };
  static CopyWork& copy_work() {
    thread_local CopyWork w;
    return w;
  }
  void copy_from(const Base& src) {
    if (src.empty()) return;
    CopyWork& w = copy_work();
    w.pending.push_back({this, &src});
    if (w.active) return;  // an enclosing copy on this thread fills this one in
    struct Active {
      CopyWork& w;
      explicit Active(CopyWork& w) : w(w) { w.active = true; }
      ~Active() {
        w.active = false;
        w.pending.clear();
      }
    } active(w);
    while (!w.pending.empty()) {
      auto [dst, from] = w.pending.back();
      w.pending.pop_back();
      dst->Base::reserve(from->size());  // nested children register addresses in this buffer
      for (const Node& n : *from) dst->Base::push_back(n);
    }
  }
};

}  // namespace vkad
