// The op contract's schema lines: ParseOpSchema reads inputs (optional `?`, variadic `...`, written `!`, fixed
// dtypes `name: int64`), typed attributes and outputs, and refuses a malformed line saying what is wrong; every
// line of the op table parses.
#include <stdexcept>
#include <string>
#include <vector>

#include "infinitrain/op.h"
#include "tests/cc/check.h"

using namespace infinitrain;

namespace infinitrain {
extern const OpDef kOpTable[];
extern const size_t kOpTableSize;
}  // namespace infinitrain

namespace {

std::vector<TensorMeta> NoShape(const char*, const std::vector<Tensor>&, const Attrs&) { return {}; }

OpSchema Parse(const char* text) { return ParseOpSchema(OpDef{text, OpTier::kRequired, kAllDtypes, "", NoShape, ""}); }

void TestInputsAttrsOutputs() {
    OpSchema s = Parse("gather(x, index: int64, extra?; dim: int, scale: float, sizes: ints, mode: str) -> (out, aux)");
    CHECK(s.name == "gather");
    CHECK(s.inputs.size() == 3);
    CHECK(s.inputs[1].name == "index" && s.inputs[1].dtype == static_cast<int>(DataType::kInt64));
    CHECK(s.inputs[0].dtype == -1 && !s.inputs[0].optional);
    CHECK(s.inputs[2].optional && !s.inputs[2].variadic);
    CHECK(s.min_inputs == 2 && s.max_inputs == 3);
    CHECK(s.typed_input == 0);
    CHECK(s.attrs.size() == 4);
    CHECK(s.attrs[0].type == AttrType::kInt && s.attrs[1].type == AttrType::kFloat);
    CHECK(s.attrs[2].type == AttrType::kInts && s.attrs[3].type == AttrType::kStr);
    CHECK((s.outputs == std::vector<std::string>{"out", "aux"}));
}

void TestVariadicAndWritten() {
    OpSchema s = Parse("adam_(step: int64, params!...) -> ()");
    CHECK(s.typed_input == 1);  // the first input without a fixed dtype
    CHECK(s.inputs[1].variadic && s.inputs[1].written);
    CHECK(s.max_inputs == -1 && s.min_inputs == 2);
    CHECK((s.Written(4) == std::vector<int>{1, 2, 3}));  // a written variadic input covers every input after it
    OpSchema t = Parse("fill_(x!, value?; v: float) -> ()");
    CHECK(t.inputs[0].written && !t.inputs[1].written);
    CHECK((t.Written(1) == std::vector<int>{0}));
    OpSchema u = Parse("copy_(dst!, src?!) -> ()");  // `!` after the `?` marker too
    CHECK(u.inputs[1].optional && u.inputs[1].written);
    CHECK((u.Written(1) == std::vector<int>{0}) && (u.Written(2) == std::vector<int>{0, 1}));
}

void TestMalformedLinesAreRefusedByName() {
    CHECK_THROWS(Parse("add x, y -> out"), std::invalid_argument, "expected 'name(inputs; attrs) -> outputs'");
    CHECK_THROWS(Parse("add(x, y)"), std::invalid_argument, "expected");
    CHECK_THROWS(Parse("1add(x) -> out"), std::invalid_argument, "bad op name '1add'");
    CHECK_THROWS(Parse("f() -> out"), std::invalid_argument, "an op needs at least one input");
    CHECK_THROWS(Parse("f(x?, y) -> out"), std::invalid_argument, "only the last inputs may be optional");
    CHECK_THROWS(Parse("f(xs..., y) -> out"), std::invalid_argument, "only the last inputs");
    CHECK_THROWS(Parse("f(x: int65) -> out"), std::invalid_argument, "unknown dtype 'int65'");
    CHECK_THROWS(Parse("f(x; dim) -> out"), std::invalid_argument, "attribute 'dim' needs a type");
    CHECK_THROWS(Parse("f(x; dim: double) -> out"), std::invalid_argument, "unknown type 'double'");
    CHECK_THROWS(Parse("f(x) -> (out"), std::invalid_argument, "unbalanced parentheses");
    CHECK_THROWS(Parse("f(x) -> 2out"), std::invalid_argument, "bad output '2out'");
    CHECK_THROWS(ParseOpSchema(OpDef{"f(x) -> out", OpTier::kRequired, kAllDtypes, "", nullptr, ""}),
                 std::invalid_argument, "no shape rule");
}

void TestTheOpTableParses() {
    CHECK(kOpTableSize > 100);
    for (size_t i = 0; i < kOpTableSize; ++i) {
        try {
            OpSchema s = ParseOpSchema(kOpTable[i]);
            CHECK(!s.name.empty() && !s.outputs.empty() ? true : s.name.back() == '_');
        } catch (const std::exception& e) {
            ::infinitrain::testing::Fail(__FILE__, __LINE__, e.what());
        }
    }
}

}  // namespace

int main() {
    TestInputsAttrsOutputs();
    TestVariadicAndWritten();
    TestMalformedLinesAreRefusedByName();
    TestTheOpTableParses();
    return ::infinitrain::testing::Failures();
}
