"""Tokenizer and parser for the CEL that CRD validation rules use; ``cel.py`` evaluates the result.

The parser knows CEL's grammar and macros but not its function library: the caller passes the
signatures it implements, so a rule naming a function nobody implements fails when it is
compiled rather than on the first object that reaches it.

Like ``cel.py`` it stays one module whatever its length (tests/test_layers.py allows both): a
grammar read against CEL's specification is easiest to check when all of it is in one place.
"""

from __future__ import annotations

import functools
import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds to import, and `trainer render` must start fast
    from collections.abc import Iterator, Mapping
    from typing import Any, ClassVar, Final, TypeAlias

    # A token is (kind, value, position); kind is one of int, uint, float, string, ident, op, eof.
    Token: TypeAlias = tuple[str, Any, int]
    # name -> (argument counts when called as f(...), argument counts when called as x.f(...)).
    Signatures: TypeAlias = Mapping[str, tuple[frozenset[int], frozenset[int]]]

INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1


class ParseError(Exception):
    """Raised for any rule that is not valid CEL; ``cel.compile`` turns it into CELSyntaxError."""


# ---------------------------------------------------------------------------------------------
# Syntax tree. Plain immutable-by-convention nodes; ``__match_args__`` lets the evaluator `match`.
# ---------------------------------------------------------------------------------------------


class Node:
    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        fields = ", ".join(repr(getattr(self, name)) for name in self.__match_args__)
        return f"{type(self).__name__}({fields})"


class Literal(Node):
    __slots__ = ("value",)
    __match_args__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Ident(Node):
    __slots__ = ("name",)
    __match_args__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Select(Node):
    """``operand.field``; with ``test`` set it is the ``has(operand.field)`` macro."""

    __slots__ = ("field", "operand", "test")
    __match_args__ = ("operand", "field", "test")

    def __init__(self, operand: Node, field: str, test: bool = False) -> None:
        self.operand = operand
        self.field = field
        self.test = test


class Index(Node):
    __slots__ = ("index", "operand")
    __match_args__ = ("operand", "index")

    def __init__(self, operand: Node, index: Node) -> None:
        self.operand = operand
        self.index = index


class ListExpr(Node):
    __slots__ = ("items",)
    __match_args__ = ("items",)

    def __init__(self, items: list[Node]) -> None:
        self.items = items


class MapExpr(Node):
    __slots__ = ("entries",)
    __match_args__ = ("entries",)

    def __init__(self, entries: list[tuple[Node, Node]]) -> None:
        self.entries = entries


class Unary(Node):
    """``!x`` or ``-x``."""

    __slots__ = ("operand", "operator")
    __match_args__ = ("operator", "operand")

    def __init__(self, operator: str, operand: Node) -> None:
        self.operator = operator
        self.operand = operand


class Binary(Node):
    """Arithmetic, relations and ``in``; ``&&`` and ``||`` are ``Logical``, as they absorb errors."""

    __slots__ = ("left", "operator", "right")
    __match_args__ = ("operator", "left", "right")

    def __init__(self, operator: str, left: Node, right: Node) -> None:
        self.operator = operator
        self.left = left
        self.right = right


class Logical(Node):
    __slots__ = ("left", "operator", "right")
    __match_args__ = ("operator", "left", "right")

    def __init__(self, operator: str, left: Node, right: Node) -> None:
        self.operator = operator
        self.left = left
        self.right = right


class Conditional(Node):
    __slots__ = ("condition", "if_false", "if_true")
    __match_args__ = ("condition", "if_true", "if_false")

    def __init__(self, condition: Node, if_true: Node, if_false: Node) -> None:
        self.condition = condition
        self.if_true = if_true
        self.if_false = if_false


class Call(Node):
    """``name(args)`` or, with a target, ``target.name(args)``."""

    __slots__ = ("args", "name", "target")
    __match_args__ = ("name", "target", "args")

    def __init__(self, name: str, target: Node | None, args: list[Node]) -> None:
        self.name = name
        self.target = target
        self.args = args


class Comprehension(Node):
    """One of the macros all, exists, exists_one, filter, map over ``range``'s elements."""

    __slots__ = ("kind", "predicate", "range", "transform", "variable")
    __match_args__ = ("kind", "range", "variable", "predicate", "transform")

    def __init__(
        self, kind: str, range_: Node, variable: str, predicate: Node | None, transform: Node | None
    ) -> None:
        self.kind = kind
        self.range = range_
        self.variable = variable
        self.predicate = predicate
        self.transform = transform


def free_names(node: Node) -> Iterator[str]:
    """Yield the variables ``node`` reads from the activation, i.e. not bound by a macro."""
    match node:
        case Ident(name):
            yield name
        case Select(operand, _, _) | Unary(_, operand):
            yield from free_names(operand)
        case Index(left, right) | Binary(_, left, right) | Logical(_, left, right):
            yield from free_names(left)
            yield from free_names(right)
        case Conditional(condition, if_true, if_false):
            for child in (condition, if_true, if_false):
                yield from free_names(child)
        case ListExpr(items):
            for item in items:
                yield from free_names(item)
        case MapExpr(entries):
            for key, value in entries:
                yield from free_names(key)
                yield from free_names(value)
        case Call(_, target, args):
            if target is not None:
                yield from free_names(target)
            for arg in args:
                yield from free_names(arg)
        case Comprehension(_, range_, variable, predicate, transform):
            yield from free_names(range_)
            for body in (predicate, transform):
                if body is not None:
                    yield from (name for name in free_names(body) if name != variable)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


@functools.cache
def _token_pattern() -> re.Pattern[str]:
    """Compiled on first use: compiling it costs more than the rest of importing this module."""
    return re.compile(
        r"""
        (?P<space>[ \t\n\r\f]+|//[^\n]*)
      | (?P<float>[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?)
      | (?P<int>0[xX][0-9a-fA-F]+[uU]?|[0-9]+[uU]?)
      | (?P<string>(?:[rR][bB]?|[bB][rR]?)?(?:\"\"\"|'''|"|'))
      | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
      | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
        """,
        re.VERBOSE,
    )


_ESCAPES: Final = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "?": "?",
    '"': '"',
    "'": "'",
    "`": "`",
}
_HEX_ESCAPE_LENGTH: Final = {"x": 2, "X": 2, "u": 4, "U": 8}
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")

_RESERVED: Final = frozenset(
    {
        *("as", "break", "const", "continue", "else", "for", "function", "if", "import", "in"),
        *("let", "loop", "package", "namespace", "return", "var", "void", "while"),
    }
)


def _error(source: str, pos: int, message: str) -> ParseError:
    return ParseError(f"{message} at position {pos} in {source!r}")


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    pattern = _token_pattern()
    pos = 0
    end = len(source)
    while pos < end:
        match = pattern.match(source, pos)
        if match is None:
            raise _error(source, pos, f"unexpected character {source[pos]!r}")
        kind = match.lastgroup or "op"
        text = match.group()
        if kind == "string":
            value, after = _scan_string(source, pos, text)
            tokens.append(("string", value, pos))
            pos = after
            continue
        if kind == "int":
            is_uint = text[-1] in "uU"
            tokens.append(("uint" if is_uint else "int", _int_literal(source, pos, text, is_uint), pos))
        elif kind == "float":
            tokens.append(("float", float(text), pos))
        elif kind != "space":
            tokens.append((kind, text, pos))
        pos = match.end()
    tokens.append(("eof", None, end))
    return tokens


def _int_literal(source: str, pos: int, text: str, is_uint: bool) -> int:
    digits = text[:-1] if is_uint else text
    value = int(digits, 16) if digits[:2] in ("0x", "0X") else int(digits)
    # INT64_MAX + 1 is only valid right after a unary minus; the parser checks that.
    if value > (UINT64_MAX if is_uint else INT64_MAX + 1):
        raise _error(source, pos, f"integer literal {text} is out of range")
    return value


def _scan_string(source: str, start: int, opener: str) -> tuple[str, int]:
    """Return the decoded string literal starting at ``start`` and the position after it."""
    prefix = opener.rstrip("'\"").lower()
    if "b" in prefix:
        raise _error(source, start, "bytes literals are not supported")
    quote = opener[len(prefix) :]
    raw = "r" in prefix
    body_start = start + len(opener)
    pos = body_start
    while not source.startswith(quote, pos):
        if pos >= len(source):
            raise _error(source, start, "unterminated string literal")
        char = source[pos]
        if char in "\n\r" and len(quote) == 1:
            raise _error(source, pos, "newline in a single-quoted string literal")
        pos += 2 if char == "\\" and not raw else 1
    body = source[body_start:pos]
    return (body if raw else _decode_escapes(source, body_start, body)), pos + len(quote)


def _decode_escapes(source: str, offset: int, body: str) -> str:
    if "\\" not in body:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = body[i + 1 : i + 2]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            i += 2
        elif code in _HEX_ESCAPE_LENGTH:
            width = _HEX_ESCAPE_LENGTH[code]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not _HEX_DIGITS.issuperset(digits):
                raise _error(source, offset + i, f"invalid \\{code} escape")
            value = int(digits, 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise _error(source, offset + i, f"escape \\{code}{digits} is not a valid code point")
            out.append(chr(value))
            i += 2 + width
        elif code and code in "0123":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or not set(digits) <= set("01234567"):
                raise _error(source, offset + i, "invalid octal escape")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise _error(source, offset + i, f"invalid escape sequence \\{code}")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Parser. Precedence, loosest first: ?:, ||, &&, relations (== != < <= > >= in), + -, * / %,
# unary ! and -, then member access, indexing and calls.
# ---------------------------------------------------------------------------------------------

_RELATIONS: Final = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})

# macro -> the argument counts it takes, after the receiver.
_MACROS: Final = {"all": (2,), "exists": (2,), "exists_one": (2,), "filter": (2,), "map": (2, 3)}


def parse(source: str, functions: Signatures) -> Node:
    """Parse ``source``; raises ParseError, including for calls that match no signature."""
    return _Parser(source, functions).parse()


class _Parser:
    def __init__(self, source: str, functions: Signatures) -> None:
        self.source = source
        self.functions = functions
        self.tokens = tokenize(source)
        self.pos = 0

    def parse(self) -> Node:
        node = self.expression()
        if self.peek()[0] != "eof":
            raise self.unexpected(self.peek())
        return node

    # -- token helpers

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        token = self.tokens[self.pos]
        if token[0] != "eof":
            self.pos += 1
        return token

    def at(self, *texts: str) -> bool:
        kind, value, _ = self.tokens[self.pos]
        return kind in ("op", "ident") and value in texts

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            kind, value, pos = self.peek()
            found = "end of expression" if kind == "eof" else repr(value)
            raise _error(self.source, pos, f"expected {text!r}, found {found}")

    def unexpected(self, token: Token) -> ParseError:
        kind, value, pos = token
        return _error(
            self.source, pos, "unexpected end of expression" if kind == "eof" else f"unexpected {value!r}"
        )

    # -- grammar

    def expression(self) -> Node:
        condition = self.logical_or()
        if self.accept("?"):
            if_true = self.logical_or()
            self.expect(":")
            return Conditional(condition, if_true, self.expression())
        return condition

    def logical_or(self) -> Node:
        node = self.logical_and()
        while self.accept("||"):
            node = Logical("||", node, self.logical_and())
        return node

    def logical_and(self) -> Node:
        node = self.relation()
        while self.accept("&&"):
            node = Logical("&&", node, self.relation())
        return node

    def relation(self) -> Node:
        node = self.addition()
        while self.at(*_RELATIONS):
            operator = self.next()[1]
            node = Binary(operator, node, self.addition())
        return node

    def addition(self) -> Node:
        node = self.multiplication()
        while self.at("+", "-"):
            operator = self.next()[1]
            node = Binary(operator, node, self.multiplication())
        return node

    def multiplication(self) -> Node:
        node = self.unary()
        while self.at("*", "/", "%"):
            operator = self.next()[1]
            node = Binary(operator, node, self.unary())
        return node

    def unary(self) -> Node:
        # CEL allows a run of one operator ('!!x', '--x') but not a mix ('!-x').
        for operator in ("!", "-"):
            if not self.at(operator):
                continue
            count = 0
            while self.accept(operator):
                count += 1
            kind, value, _ = self.peek()
            if operator == "-" and kind in ("int", "float"):
                # Fold the sign into the literal so that -9223372036854775808 is representable.
                self.next()
                count -= 1
                node = self.member_suffix(Literal(-value))
            else:
                node = self.member()
            for _ in range(count):
                node = Unary(operator, node)
            return node
        return self.member()

    def member(self) -> Node:
        return self.member_suffix(self.primary())

    def member_suffix(self, node: Node) -> Node:
        while True:
            if self.accept("."):
                kind, name, pos = self.next()
                if kind != "ident":
                    raise _error(self.source, pos, "expected a field or method name after '.'")
                is_call = self.accept("(")
                node = self.call(name, node, self.items(")"), pos) if is_call else Select(node, name)
            elif self.accept("["):
                index = self.expression()
                self.expect("]")
                node = Index(node, index)
            else:
                return node

    def items(self, closer: str) -> list[Node]:
        """A comma-separated list up to ``closer``; a list literal may end in a comma, a call not."""
        items: list[Node] = []
        if self.accept(closer):
            return items
        while True:
            items.append(self.expression())
            if self.accept(closer):
                return items
            self.expect(",")
            if closer == "]" and self.accept(closer):
                return items

    def primary(self) -> Node:
        token = self.next()
        kind, value, pos = token
        if kind == "int" and value > INT64_MAX:
            raise _error(self.source, pos, f"integer literal {value} is out of range")
        if kind in ("int", "uint", "float", "string"):
            return Literal(value)
        if kind == "ident":
            if value in ("true", "false", "null"):
                return Literal({"true": True, "false": False, "null": None}[value])
            if value in _RESERVED:
                raise _error(self.source, pos, f"reserved word {value!r} cannot be used here")
            if self.accept("("):
                return self.call(value, None, self.items(")"), pos)
            return Ident(value)
        if kind == "op":
            if value == ".":
                # A leading dot names the root scope: '.self' is 'self'.
                name_kind, name, name_pos = self.next()
                if name_kind != "ident":
                    raise _error(self.source, name_pos, "expected an identifier after '.'")
                return Ident(name)
            if value == "(":
                node = self.expression()
                self.expect(")")
                return node
            if value == "[":
                return ListExpr(self.items("]"))
            if value == "{":
                return self.map_literal()
        raise self.unexpected(token)

    def map_literal(self) -> Node:
        entries: list[tuple[Node, Node]] = []
        while not self.accept("}"):
            key = self.expression()
            self.expect(":")
            entries.append((key, self.expression()))
            if not self.accept(","):
                self.expect("}")
                break
        return MapExpr(entries)

    def call(self, name: str, target: Node | None, args: list[Node], pos: int) -> Node:
        if target is None and name == "has":
            if len(args) != 1 or not isinstance(args[0], Select) or args[0].test:
                raise _error(self.source, pos, "has() needs a single field selection, like has(a.b)")
            return Select(args[0].operand, args[0].field, test=True)
        if target is not None and name in _MACROS and len(args) in _MACROS[name]:
            variable = args[0]
            if not isinstance(variable, Ident):
                raise _error(self.source, pos, f"{name}() needs a variable name as its first argument")
            if name == "map":
                predicate = args[1] if len(args) == 3 else None
                return Comprehension(name, target, variable.name, predicate, args[-1])
            return Comprehension(name, target, variable.name, args[1], None)
        signature = self.functions.get(name)
        if signature is None:
            raise _error(self.source, pos, f"undeclared reference to function '{name}'")
        as_function, as_method = signature
        if target is None and len(args) not in as_function:
            hint = f"; call it as a method, x.{name}(...)" if as_method else ""
            raise _error(self.source, pos, f"no overload of '{name}' takes {len(args)} argument(s){hint}")
        if target is not None and len(args) not in as_method:
            hint = f"; call it as a function, {name}(...)" if as_function else ""
            raise _error(
                self.source, pos, f"no overload of method '{name}' takes {len(args)} argument(s){hint}"
            )
        return Call(name, target, args)
