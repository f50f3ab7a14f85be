#include "spirv/spirv_outline.h"

#include <spirv-tools/libspirv.h>

#include <algorithm>
#include <map>
#include <spirv/unified1/spirv.hpp>
#include <unordered_map>
#include <unordered_set>

namespace vkad::codegen {

namespace {

struct Inst {
  std::vector<uint32_t> w;
  uint16_t op = 0;
  uint32_t type = 0, result = 0;
  std::vector<uint16_t> ids;  // word offsets of id operands (not the result or result type)
};

struct Block {
  Inst label;
  std::vector<Inst> body;  // up to and including the terminator
};

Inst make(spv::Op op, std::vector<uint32_t> operands, std::vector<uint16_t> ids, uint32_t type = 0,
          uint32_t result = 0) {
  Inst i;
  i.w.push_back(0);
  i.w.insert(i.w.end(), operands.begin(), operands.end());
  i.w[0] = (static_cast<uint32_t>(i.w.size()) << 16) | static_cast<uint32_t>(op);
  i.op = static_cast<uint16_t>(op);
  i.type = type;
  i.result = result;
  i.ids = std::move(ids);
  return i;
}

bool is_terminator(uint16_t op) {
  switch (static_cast<spv::Op>(op)) {
    case spv::OpBranch:
    case spv::OpBranchConditional:
    case spv::OpSwitch:
    case spv::OpReturn:
    case spv::OpReturnValue:
    case spv::OpKill:
    case spv::OpUnreachable:
    case spv::OpTerminateInvocation: return true;
    default: return false;
  }
}

bool is_branch(uint16_t op) {
  switch (static_cast<spv::Op>(op)) {
    case spv::OpBranch:
    case spv::OpBranchConditional:
    case spv::OpSwitch:
    case spv::OpLoopMerge:
    case spv::OpSelectionMerge: return true;
    default: return false;
  }
}

struct Function {
  std::vector<Inst> head;  // OpFunction, its parameters
  std::vector<Block> blocks;
};

struct Module {
  uint32_t header[5] = {};
  std::vector<Inst> globals;
  std::vector<Function> fns;  // the entry point, then the functions outlined from it
  Inst fn_end;
  bool ok = true;
};

struct ParseState {
  Module* m;
  int stage = 0;  // 0: globals, 1: function head, 2: blocks, 3: after the function
};

spv_result_t on_header(void* user, spv_endianness_t, uint32_t magic, uint32_t version,
                       uint32_t generator, uint32_t bound, uint32_t schema) {
  Module* m = static_cast<ParseState*>(user)->m;
  uint32_t h[5] = {magic, version, generator, bound, schema};
  std::copy(h, h + 5, m->header);
  return SPV_SUCCESS;
}

spv_result_t on_inst(void* user, const spv_parsed_instruction_t* p) {
  ParseState* s = static_cast<ParseState*>(user);
  Module& m = *s->m;
  Inst i;
  i.w.assign(p->words, p->words + p->num_words);
  i.op = p->opcode;
  i.type = p->type_id;
  i.result = p->result_id;
  for (uint16_t k = 0; k < p->num_operands; ++k) {
    const spv_parsed_operand_t& o = p->operands[k];
    if (o.type == SPV_OPERAND_TYPE_ID || o.type == SPV_OPERAND_TYPE_SCOPE_ID ||
        o.type == SPV_OPERAND_TYPE_MEMORY_SEMANTICS_ID) {
      i.ids.push_back(o.offset);
    }
  }
  const auto op = static_cast<spv::Op>(i.op);
  switch (s->stage) {
    case 0:
      if (op == spv::OpFunction) {
        s->stage = 1;
        m.fns.emplace_back();
        m.fns.back().head.push_back(std::move(i));
      } else {
        m.globals.push_back(std::move(i));
      }
      break;
    case 1:
    case 2:
      if (op == spv::OpFunctionParameter && s->stage == 1) {
        m.fns.back().head.push_back(std::move(i));
      } else if (op == spv::OpLabel) {
        s->stage = 2;
        m.fns.back().blocks.push_back({std::move(i), {}});
      } else if (op == spv::OpFunctionEnd) {
        s->stage = 3;
        m.fn_end = std::move(i);
      } else if (std::vector<Block>& bs = m.fns.back().blocks;
                 s->stage == 2 && !bs.empty() &&
                 (bs.back().body.empty() || !is_terminator(bs.back().body.back().op))) {
        bs.back().body.push_back(std::move(i));
      } else {
        m.ok = false;
      }
      break;
    default: m.ok = false;  // a second function: not what the emitter makes
  }
  return SPV_SUCCESS;
}

class Outliner {
 public:
  explicit Outliner(Module& m) : m_(m) {
    for (const Inst& g : m_.globals) {
      if (g.result) global_.insert(g.result);
      if (g.op == spv::OpTypeVoid) void_ = g.result;
      if (g.op == spv::OpTypePointer) pointer_types_.insert(g.result);
    }
  }

  // Returns how many loops it moved. Top down: in each function (the entry point first, then
  // each function made), the loops `every` levels deep move out; one that cannot gives its
  // child loops a try instead.
  size_t run(uint32_t every) {
    if (!void_ || every == 0) return 0;
    size_t moved = 0;
    for (size_t f = 0; f < m_.fns.size(); ++f) {  // grows as functions are made
      std::vector<Loop> loops;
      if (!find_loops(m_.fns[f], &loops)) return moved;
      std::vector<uint32_t> todo;  // header labels, in reverse so the first comes off the back
      for (auto it = loops.rbegin(); it != loops.rend(); ++it) {
        if (it->depth == every) todo.push_back(it->header);
      }
      while (!todo.empty()) {
        const uint32_t header = todo.back();
        todo.pop_back();
        index_labels(m_.fns[f]);
        if (outline(f, index_.at(header))) {
          ++moved;
          continue;
        }
        const Loop& l = *std::find_if(loops.begin(), loops.end(),
                                      [&](const Loop& x) { return x.header == header; });
        for (auto it = loops.rbegin(); it != loops.rend(); ++it) {
          if (it->parent == header) todo.push_back(it->header);
        }
        (void)l;
      }
    }
    return moved;
  }

 private:
  struct Loop {
    uint32_t header = 0, parent = 0;  // labels (parent: the enclosing loop's header, 0: none)
    uint32_t depth = 0;               // enclosing loops in its function
  };

  // The loops of `f` in order, with their nesting; false if a merge block does not follow its
  // loop (not the layout this pass expects).
  bool find_loops(const Function& f, std::vector<Loop>* out) {
    index_labels(f);
    std::vector<std::pair<size_t, uint32_t>> open;  // (merge index, header label)
    for (size_t b = 0; b < f.blocks.size(); ++b) {
      while (!open.empty() && open.back().first == b) open.pop_back();
      const Inst* merge = loop_merge(f.blocks[b]);
      if (!merge) continue;
      auto it = index_.find(merge->w[1]);
      if (it == index_.end() || it->second <= b) return false;
      const uint32_t header = f.blocks[b].label.result;
      out->push_back(
          {header, open.empty() ? 0u : open.back().second, static_cast<uint32_t>(open.size())});
      open.push_back({it->second, header});
    }
    return true;
  }

  static const Inst* loop_merge(const Block& b) {
    if (b.body.size() < 2) return nullptr;
    const Inst& i = b.body[b.body.size() - 2];
    return i.op == spv::OpLoopMerge ? &i : nullptr;
  }

  void index_labels(const Function& f) {
    index_.clear();
    for (size_t b = 0; b < f.blocks.size(); ++b) index_[f.blocks[b].label.result] = b;
  }

  uint32_t fresh() { return m_.header[3]++; }

  uint32_t function_type(const std::vector<uint32_t>& params) {
    auto it = fn_types_.find(params);
    if (it != fn_types_.end()) return it->second;
    for (const Inst& g : m_.globals) {
      if (g.op == spv::OpTypeFunction && g.w[2] == void_ &&
          std::vector<uint32_t>(g.w.begin() + 3, g.w.end()) == params) {
        return fn_types_[params] = g.result;
      }
    }
    const uint32_t id = fresh();
    std::vector<uint32_t> ops = {id, void_};
    ops.insert(ops.end(), params.begin(), params.end());
    m_.globals.push_back(make(spv::OpTypeFunction, ops, {}, 0, id));
    global_.insert(id);
    return fn_types_[params] = id;
  }

  // A loop being moved: blocks [h, end) of its function, and what moving it needs.
  struct Region {
    size_t h = 0, end = 0;
    uint32_t header = 0, merge = 0;                  // labels
    std::unordered_set<uint32_t> defined;            // ids defined inside (labels included)
    std::unordered_map<uint32_t, const Inst*> defs;  // definitions outside, for their types
    std::vector<uint32_t> free_ids, param_types;     // values from outside: the parameters
    std::unordered_map<uint32_t, uint32_t> rename;   // outside id -> the function's id
    uint32_t entry = 0, ret = 0, inner_header = 0;   // the function's new labels
  };

  // Moves the loop headed by block `h` into a function, if it qualifies (see the header).
  bool outline(size_t f, size_t h) {
    std::vector<Block>& blocks = m_.fns[f].blocks;
    Region r;
    r.h = h;
    r.merge = loop_merge(blocks[h])->w[1];
    r.end = index_.at(r.merge);
    r.header = blocks[h].label.result;
    if (!collect_definitions(m_.fns[f], r)) return false;
    r.entry = fresh(), r.ret = fresh(), r.inner_header = fresh();
    r.rename[r.header] = r.inner_header;
    r.rename[r.merge] = r.ret;
    if (!collect_free_ids(blocks, r)) return false;
    if (r.free_ids.size() > 250) return false;  // the validator's limit on parameters is 255
    const uint32_t fn = fresh();
    global_.insert(fn);
    Function made = make_function(blocks, r, fn);
    // In its place: a block (the header's label, so the branches into it stand) that calls it.
    Block call = call_block(r, fn);
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(h) + 1,
                 blocks.begin() + static_cast<std::ptrdiff_t>(r.end));
    blocks[h] = std::move(call);
    m_.fns.push_back(std::move(made));  // invalidates `blocks`
    return true;
  }

  // The ids defined inside the loop, and the definitions of the function's other values (for
  // the types of the free ones). False if the loop holds a variable or a value it defines is
  // used after it.
  bool collect_definitions(const Function& fn, Region& r) {
    const std::vector<Block>& blocks = fn.blocks;
    for (size_t b = r.h; b < r.end; ++b) {
      r.defined.insert(blocks[b].label.result);
      for (const Inst& i : blocks[b].body) {
        if (i.op == spv::OpVariable) return false;
        if (i.result) r.defined.insert(i.result);
      }
    }
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (b >= r.h && b < r.end) continue;
      for (const Inst& i : blocks[b].body) {
        if (i.result) r.defs[i.result] = &i;
        for (uint16_t k : i.ids) {
          if (r.defined.count(i.w[k]) && i.w[k] != r.header) return false;  // used after the loop
        }
      }
    }
    for (const Inst& i : fn.head) {
      if (i.result) r.defs[i.result] = &i;
    }
    return true;
  }

  // The values the loop uses from outside become parameters; the one block outside it may
  // name is its entry edge's (header phis), renamed to the function's entry. False for
  // anything else from outside: a branch to the merge block other than a structured one, a
  // pointer that is not a variable or parameter, an id without a typed definition.
  bool collect_free_ids(const std::vector<Block>& blocks, Region& r) {
    uint32_t pre = 0;
    for (size_t b = r.h; b < r.end; ++b) {
      for (const Inst& i : blocks[b].body) {
        for (uint16_t k : i.ids) {
          const uint32_t id = i.w[k];
          if (global_.count(id) || r.defined.count(id)) continue;
          if (id == r.merge) {
            if (!is_branch(i.op)) return false;
            continue;
          }
          if (index_.count(id)) {  // a block outside: only the entry edge of the header's phis
            if (b != r.h || i.op != spv::OpPhi || (k % 2) != 0 || (pre && pre != id)) return false;
            pre = id;
            r.rename[id] = r.entry;
            continue;
          }
          if (r.rename.count(id)) continue;
          if (!add_parameter(r, id)) return false;
        }
      }
    }
    return true;
  }
  bool add_parameter(Region& r, uint32_t id) {
    auto d = r.defs.find(id);
    if (d == r.defs.end() || !d->second->type) return false;
    if (d->second->op != spv::OpVariable && d->second->op != spv::OpFunctionParameter &&
        pointer_types_.count(d->second->type)) {
      return false;
    }
    r.free_ids.push_back(id);
    r.param_types.push_back(d->second->type);
    r.rename[id] = fresh();
    return true;
  }

  // The function: entry -> the loop (renamed; its blocks move out of `blocks`) -> a block
  // that returns.
  Function make_function(std::vector<Block>& blocks, Region& r, uint32_t fn) {
    Function made;
    made.head.push_back(make(
        spv::OpFunction, {void_, fn, spv::FunctionControlMaskNone, function_type(r.param_types)},
        {}, void_, fn));
    for (size_t p = 0; p < r.free_ids.size(); ++p) {
      const uint32_t id = r.rename[r.free_ids[p]];
      made.head.push_back(
          make(spv::OpFunctionParameter, {r.param_types[p], id}, {}, r.param_types[p], id));
    }
    Block first;
    first.label = make(spv::OpLabel, {r.entry}, {}, 0, r.entry);
    first.body.push_back(make(spv::OpBranch, {r.inner_header}, {1}));
    made.blocks.push_back(std::move(first));
    for (size_t b = r.h; b < r.end; ++b) {
      Block& blk = blocks[b];
      if (blk.label.result == r.header)
        blk.label.w[1] = r.inner_header, blk.label.result = r.inner_header;
      for (Inst& i : blk.body) {
        for (uint16_t k : i.ids) {
          auto it = r.rename.find(i.w[k]);
          if (it != r.rename.end()) i.w[k] = it->second;
        }
      }
      made.blocks.push_back(std::move(blk));
    }
    Block last;
    last.label = make(spv::OpLabel, {r.ret}, {}, 0, r.ret);
    last.body.push_back(make(spv::OpReturn, {}, {}));
    made.blocks.push_back(std::move(last));
    return made;
  }

  Block call_block(const Region& r, uint32_t fn) {
    Block call;
    call.label = make(spv::OpLabel, {r.header}, {}, 0, r.header);
    std::vector<uint32_t> ops = {void_, fresh(), fn};
    std::vector<uint16_t> ids = {3};
    for (uint32_t id : r.free_ids) {
      ids.push_back(static_cast<uint16_t>(ops.size() + 1));
      ops.push_back(id);
    }
    call.body.push_back(make(spv::OpFunctionCall, ops, ids, void_, ops[1]));
    call.body.push_back(make(spv::OpBranch, {r.merge}, {1}));
    return call;
  }

  Module& m_;
  std::unordered_set<uint32_t> global_, pointer_types_;
  std::unordered_map<uint32_t, size_t> index_;
  std::map<std::vector<uint32_t>, uint32_t> fn_types_;
  uint32_t void_ = 0;
};

}  // namespace

std::vector<uint32_t> outline_deep_loops(const std::vector<uint32_t>& words, uint32_t every) {
  Module m;
  ParseState st{&m};
  spv_context ctx = spvContextCreate(SPV_ENV_VULKAN_1_2);
  spv_result_t r =
      spvBinaryParse(ctx, &st, words.data(), words.size(), on_header, on_inst, nullptr);
  spvContextDestroy(ctx);
  if (r != SPV_SUCCESS || !m.ok || st.stage != 3 || m.fns.size() != 1 || m.fns[0].blocks.empty())
    return words;
  if (Outliner(m).run(every) == 0) return words;
  std::vector<uint32_t> out(m.header, m.header + 5);
  auto put = [&out](const Inst& i) { out.insert(out.end(), i.w.begin(), i.w.end()); };
  for (const Inst& i : m.globals) put(i);
  for (const Function& f : m.fns) {
    for (const Inst& i : f.head) put(i);
    for (const Block& b : f.blocks) {
      put(b.label);
      for (const Inst& i : b.body) put(i);
    }
    put(m.fn_end);
  }
  return out;
}

}  // namespace vkad::codegen
