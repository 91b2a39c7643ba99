"""How candidate code could reach functions the policy never lets it name, and the rules that close
those ways by construct rather than by spelling (policy.py applies them):

- C++: code reached by address (`code_by_address`): a function of PyTorch or a vendor library
  found from an allowed import (by offset, by the mapped ELF image, by the library's file) and
  called through a pointer made from data;
- Python: modules reached as attributes of other modules (`foreign_module_attrs`), by rule over
  every module of the standard library and the numeric libraries rather than by their usual names.
"""

from __future__ import annotations

import re
import sys


def strip_cpp(source: str) -> str:
    """Remove comments and string/char literals (keeping line structure) before scanning."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)

    def blank(m: re.Match) -> str:
        text = m.group(0)
        if text.startswith('"') or text.startswith("'"):
            return text[0] + text[-1]
        return re.sub(r"[^\n]", " ", text)

    return pattern.sub(blank, source)


# Modules reached as an attribute of another module, by rule rather than by a list of their
# usual names: every module of the standard library and the numeric libraries a candidate could
# compute with, under any owner but a method's own `self` (what a candidate stored there it already
# had). Left out: names that are also ordinary attributes of tensors or torch (`x.chunk`,
# `x.select`, `torch.random`, `torch.trace`, `torch.types`), which reach no foreign module.
_FOREIGN_MODULE_NAMES = frozenset(getattr(sys, "stdlib_module_names", ())) | {
    "numpy", "np", "scipy", "sympy", "mpmath", "numba", "cupy", "jax", "tensorflow", "triton", "einops",
    "numexpr", "pandas", "sklearn", "cffi", "psutil", "pyarrow", "ml_dtypes", "opt_einsum", "networkx"}
_TENSOR_NAMES_NOT_MODULES = frozenset({"chunk", "select", "random", "trace", "types",
                                       "copy"})  # dict.copy(), list.copy(); the copy module computes nothing


def foreign_module_attrs(importable: set[str]) -> frozenset[str]:
    """Attribute names refused as ways to modules outside `importable` (the policy's imports)."""
    tops = {part for m in importable for part in m.split(".")}  # `collections.abc` as imported
    if "numpy" in tops:
        tops.add("np")
    return frozenset(n for n in _FOREIGN_MODULE_NAMES - tops - _TENSOR_NAMES_NOT_MODULES if not n.startswith("_"))


# Code reached by address. An allowed import into libtorch (or the vendor libraries it loads) is an
# anchor from which every function there can be found: by a fixed offset, by walking the mapped ELF
# image, or from the library's file read from disk. Calling what was found always takes one step
# honest kernels never need: turning data (an integer, a `void*`, bytes copied from memory) into a
# function. Choosing among the candidate's own kernels is a pointer initialised from a function's
# name, and handing a kernel to the runtime (`(const void*)kernel`) converts the other way, so both
# stay allowed, and so do data pointer casts (`reinterpret_cast<float4*>`). Refused: casts whose
# target is a function type written out (`(*)(`, `(&)(`, a function type as a template argument),
# named by a typedef/using of one, or `decltype`; bit casts to them; unions holding a function
# pointer; bytes copied into (or the address taken of) a function pointer variable; and the ways
# to the loader's own tables (link maps, program headers, auxiliary vector, /proc). A regular
# expression does not type-check C++: a template parameter instantiated with a function type
# elsewhere is a gap this scan narrows (function types as template arguments are refused) but does
# not close; the import table (`check_binary`) and the observers stay in place behind it.
_CASTS = r"(?:reinterpret_cast|static_cast|const_cast|dynamic_cast|bit_cast)\s*<"
_FN_DECL = r"\(\s*(?:__\w+\s+)?[*&^]\s*(?:const\s*)?\)\s*\("   # (*)( : a function pointer/reference type
_CPP_BY_ADDRESS = [
    (_CASTS + r"[^;{}]*?" + _FN_DECL, "a cast to a function pointer type"),
    (_CASTS + r"\s*(?:const\s+)?(?:typename\s+)?decltype\b", "a cast to a decltype'd type"),
    (r"\(\s*(?:const\s+)?decltype\s*\([^;]*?\)\s*[*&]*\s*\)\s*[\w(&*]", "a cast to a decltype'd type"),
    (r"\(\s*(?:const\s+)?[\w:]+(?:\s*[*&])*\s*" + _FN_DECL + r"[^()]*\)\s*\)\s*[\w(&*]",
     "a cast to a function pointer type"),
    (r"(?<!function)<\s*(?:const\s+)?[\w:]+[\s*&]*" + _FN_DECL, "a function pointer type as a template argument"),
    (r"(?<!function)<\s*(?:const\s+)?(?!(?:sizeof|alignof|decltype|noexcept|alignas)\b)[\w:]+[\s*&]*\([^()<>;]*\)"
     r"\s*[*&]?\s*>", "a function type as a template argument"),
    (r"<\s*(?:const\s+)?decltype\s*\(\s*&?\s*[\w:]+\s*\)\s*[*&]?\s*[,>]",
     "a declared entity's type (decltype(f), decltype(&f)) as a template argument"),
    (r"\b__builtin_bit_cast\b|\b__builtin_(?:launder|dynamic_object_size|frame_address|return_address|extract_return_addr)\b",
     "bit casts and addresses the compiler does not check"),
    (r"\bunion\b[^{};]*\{[^{}]*" + r"\(\s*\*", "a union holding a function pointer"),
    (r"\b(?:dl_iterate_phdr|dladdr1?|dlinfo|link_map|_r_debug|r_debug|_DYNAMIC|__ehdr_start|__executable_start|"
     r"getauxval|AT_PHDR|AT_BASE|AT_SYSINFO_EHDR|_dl_\w+|__libc_\w+|ElfW|Elf(?:32|64)_\w+)\b",
     "the dynamic loader's tables or ELF images"),
]
# In the raw text (string literals kept): paths into the process's own description
_CPP_RAW_PATHS = re.compile(r"/proc/|/sys/|/dev/(?:mem|kmem)|\.so\b")


def _named_function_types(code: str) -> tuple[set[str], set[str]]:
    """Names of function (pointer) types declared by typedef or using, and names of variables,
    members and parameters declared with a function pointer type (inline or by such a name)."""
    types = set(re.findall(r"\btypedef\b[^;{}]*?\(\s*[*&^]?\s*(\w+)\s*\)\s*\(", code))
    for name, rhs in re.findall(r"\busing\s+(\w+)\s*=\s*([^;{}]*)", code):
        rhs = rhs.strip()
        # a function type, a pointer or reference to one, or a decltype (`decltype(&at::foo)`);
        # arithmetic aliases (`std::conditional<...>::type`) are left alone
        if re.search(_FN_DECL, rhs) or re.fullmatch(r"[\w:\s<>,*&]+\([^()]*\)\s*(?:noexcept)?", rhs) \
                or rhs.startswith("decltype"):
            types.add(name)
    # A class that holds a function pointer, or has virtual functions (whose table a forged object
    # points anywhere), is a function type too where data is cast to it; so is a class holding one.
    bodies = dict(re.findall(r"\b(?:struct|class|union)\s+(\w+)[^{};]*\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", code))
    grown = True
    while grown:
        grown = False
        for name, body in bodies.items():
            if name not in types and (re.search(_FN_DECL + r"|\(\s*\*\s*\w+\s*\)\s*\(|\bvirtual\b", body)
                                      or any(re.search(rf"\b{re.escape(t)}\b", body) for t in types)):
                types.add(name)
                grown = True
    values = set(re.findall(r"\(\s*[*&]\s*(?:const\s*)?(\w+)\s*(?:\[[^\]]*\])?\s*\)\s*\(", code))
    for t in types:
        values |= set(re.findall(rf"\b{re.escape(t)}\s*[*&]*\s*(?:const\s+)?(\w+)\s*[=;,)\[{{]", code))
    return types, values - {"const"}


def code_by_address(source: str) -> list[tuple[int, str, str]]:
    """(offset, text, why) of each construct that turns data into a function (see above)."""
    code = strip_cpp(source)
    found = [(m.start(), m.group(0), why) for pattern, why in _CPP_BY_ADDRESS for m in re.finditer(pattern, code)]
    found += [(m.start(), m.group(0), "paths to the process's own maps, memory or libraries")
              for m in _CPP_RAW_PATHS.finditer(re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.S))
              if _in_string_literal(source, m.start())]
    types, values = _named_function_types(code)
    for t in types:
        for m in re.finditer(_CASTS + rf"\s*(?:const\s+)?{re.escape(t)}\b|\(\s*(?:const\s+)?{re.escape(t)}\s*[*&]*\s*\)"
                             rf"\s*[\w(&*]", code):
            found.append((m.start(), m.group(0), f"a cast to '{t}' (a function type, or a class holding a function pointer or virtual functions)"))
    for v in values:
        for m in re.finditer(rf"\bmem(?:cpy|move|set)\s*\(\s*(?:\([^()]*\)\s*)?&?\s*{re.escape(v)}\b|(?<![&\w])&\s*{re.escape(v)}\b",
                             code):
            found.append((m.start(), m.group(0), f"writing the function pointer '{v}' as bytes"))
    return sorted(found)


def _in_string_literal(source: str, pos: int) -> bool:
    line = source[source.rfind("\n", 0, pos) + 1: pos]
    return line.count('"') % 2 == 1
