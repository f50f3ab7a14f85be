// The op table (ir/ops.def) and what follows from it: names that parse back to their op,
// family positions that agree with the family enums, block counts the parser builds, and the
// Python builder's op list (python/vkad/builder.py, IR_OPS) held against the table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "ir/ir.h"
#include "ir/text.h"

#ifndef VKAD_SOURCE_DIR
#define VKAD_SOURCE_DIR "."
#endif

namespace vkad::codegen {
namespace {

std::string source_dir() {
  const char* env = std::getenv("VKAD_SOURCE_DIR");
  return env && *env ? env : VKAD_SOURCE_DIR;
}

Op op_at(size_t i) { return static_cast<Op>(i); }

TEST(OpTable, EveryNameParsesBackToItsOp) {
  std::set<std::string> names;
  for (size_t i = 0; i < kNumOps; ++i) {
    const OpInfo& info = op_info(op_at(i));
    ASSERT_NE(info.name, nullptr) << "op " << i;
    EXPECT_TRUE(names.insert(info.name).second) << "two ops are called " << info.name;
    Op back = Op::kConst;
    ASSERT_TRUE(op_from_name(info.name, &back)) << info.name;
    EXPECT_EQ(back, op_at(i)) << info.name;
  }
  Op none = Op::kConst;
  EXPECT_FALSE(op_from_name("no_such_op", &none));
}

// The family enums are generated from the same rows as Op, so the i-th op of a family is the
// family enum's member i: checked against members named explicitly.
TEST(OpTable, FamilyMembersMatchTheirOps) {
  EXPECT_EQ(leaf_op(Op::kShape), LeafOp::kShape);
  EXPECT_EQ(unary_op(Op::kNeg), UnaryOp::kNeg);
  EXPECT_EQ(unary_op(Op::kCeil), UnaryOp::kCeil);
  EXPECT_EQ(binary_op(Op::kAtan2), BinaryOp::kAtan2);
  EXPECT_EQ(binary_op(Op::kOr), BinaryOp::kOr);
  EXPECT_EQ(compare_op(Op::kNe), CompareOp::kNe);
  EXPECT_EQ(local_op(Op::kStoreLocal), LocalOp::kStoreLocal);
  // atomic_max sits after the control ops in Op; its family position ignores them.
  EXPECT_EQ(array_op(Op::kAtomicMax), ArrayOp::kAtomicMax);
  EXPECT_EQ(control_op(Op::kContinue), ControlOp::kContinue);
  EXPECT_EQ(control_op(Op::kBarrier), ControlOp::kBarrier);
  EXPECT_EQ(stack_op(Op::kStackAccAdj), StackOp::kStackAccAdj);
  EXPECT_EQ(op_info(Op::kAtomicMax).family, OpFamily::kArray);
  EXPECT_EQ(op_info(Op::kSelect).family, OpFamily::kSelect);
}

// The table's block counts are what the text form builds (the verifier rejects others).
TEST(OpTable, BlockCountsAreWhatTheParserBuilds) {
  Result<Kernel> k = parse(R"(kernel k(n: i32) {
  task t parallel %i in [0, 4) {
    %b = lt %i, %i : bool
    if %b {
    }
    %z = const 0 : i32
    for %j in [%z, %i) {
    }
    while %w (%c) {
      %c = lt %w, %i : bool
    } do {
    }
  }
}
)");
  ASSERT_TRUE(k.ok()) << k.status().message();
  size_t checked = 0;
  for (const Stmt& s : k->tasks[0].body.stmts) {
    EXPECT_EQ(s.blocks.size(), op_info(s.op).blocks) << op_info(s.op).name;
    checked += op_info(s.op).blocks != 0;
  }
  EXPECT_EQ(checked, 3u);
}

// Ops the Python builder does not offer, and why; every other op of the table must be in
// its IR_OPS, and IR_OPS must name only ops of the table.
const std::set<std::string> kNotInPython = {
    "atomic_max",                                    // the trip counter's, not the DSL's
    "barrier",                                       // graph replay's resident kernels
    "shared_alloc",  "load_shared", "store_shared",  // the graph rework's blocked stencils
    "stack_alloc",   "stack_push",  "stack_pop",    "stack_top", "stack_top_adj",
    "stack_acc_adj",  // reverse mode's adstacks
};

std::set<std::string> python_ir_ops() {
  std::ifstream in(source_dir() + "/python/vkad/builder.py");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string open = "IR_OPS = frozenset({";
  size_t at = text.find(open);
  if (at == std::string::npos) return {};
  size_t end = text.find("})", at);
  std::set<std::string> out;
  for (size_t q = text.find('"', at); q < end; q = text.find('"', q)) {
    size_t close = text.find('"', q + 1);
    out.insert(text.substr(q + 1, close - q - 1));
    q = close + 1;
  }
  return out;
}

TEST(OpTable, PythonBuilderOpListMatchesTheTable) {
  const std::set<std::string> python = python_ir_ops();
  ASSERT_FALSE(python.empty()) << "no IR_OPS in " << source_dir() << "/python/vkad/builder.py";
  std::set<std::string> table;
  for (size_t i = 0; i < kNumOps; ++i) table.insert(op_info(op_at(i)).name);
  for (const std::string& n : python) {
    EXPECT_TRUE(table.count(n)) << "builder.py's IR_OPS names '" << n << "', not an op of ops.def";
    EXPECT_FALSE(kNotInPython.count(n)) << "'" << n << "' is in IR_OPS and in kNotInPython";
  }
  for (const std::string& n : table) {
    EXPECT_TRUE(python.count(n) || kNotInPython.count(n))
        << "op '" << n << "' of ops.def is neither in builder.py's IR_OPS nor in kNotInPython";
  }
}

}  // namespace
}  // namespace vkad::codegen
