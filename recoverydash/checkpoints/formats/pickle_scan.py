"""What reading a pickle will cost, worked out from its opcodes before anything is built.

A pickle is a program for a stack machine: one byte of ``N`` (NONE) pushes one object, so 64 MiB
of them make the unpickler hold a 64-million-item stack (half a GiB of pointers), and a list
memoised once and then copied by every ``REDUCE`` that names it costs the square of its length.
:func:`scan_pickle` reads the opcodes without building any object (its own stack holds small
integers: an id per container, its length, the ids inside each tuple) and refuses a pickle
whose reading would exceed a :class:`PickleBudget`:

* ``ops``: opcodes (the unpickler's time is linear in them and in the copies below);
* ``stack``: items on the stack plus open marks at any moment;
* ``memo``: a memo index may exceed the number of memo stores so far by at most this much (the
  C unpickler sizes its memo array by twice the largest index, so one ``LONG_BINPUT 2**31`` would
  ask for 32 GiB);
* ``words``: an estimate of what the unpickler allocates, in 8-byte words: every object pushed
  (a pointer and the object: 1 for ``None``, about 9 for an empty dict, 7 plus a string's bytes
  / 8...), every item added to a container (5), every memo entry (2), and every container
  copied by a call (5 per item): the arguments of ``REDUCE`` / ``NEWOBJ`` / ``NEWOBJ_EX`` /
  ``OBJ`` / ``INST`` and the items of a tuple given to ``REDUCE`` (``tuple(x)``, ``set(x)``),
  the state given to ``BUILD`` (copied into ``__dict__``), by their lengths *at that point*
  (a container is tracked by identity through the memo, so one memoised, grown, and copied a
  thousand times is charged a thousand times its length), and every item that hashing a dict's
  key or a set's item reads (a tuple reads its items, and a tuple of tuples shared through the
  memo is worked out once per tuple: hashing one 40 levels deep reads 2**41 items).

Declared lengths are checked too: a string, bytes or frame running past the data's end is
``size_mismatch`` (the stream is cut), before anything is allocated for it. Out-of-band buffers
(``NEXT_BUFFER``), an unknown opcode, a pop below the bottom or a ``GET`` of a memo slot never
set are ``schema_unsupported``, as the unpickler would refuse them.

The scan costs about 0.6 microseconds per opcode and holds a few words per container (never
more than ``stack`` items on its stack), so a pickle is refused after at most ``ops`` opcodes
(or ``stack``: the 64 MiB of ``N`` above after one million of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, NoReturn


class PickleBudget(NamedTuple):
    """The most reading one pickle may cost (module doc): ``bytes`` (its length), ``ops``
    (opcodes), ``stack`` (stack items and marks at once), ``memo`` (how far a memo index may run
    ahead of the stores so far), ``words`` (8-byte words the unpickler is estimated to
    allocate)."""

    bytes: int
    ops: int
    stack: int
    memo: int
    words: int


PICKLE_BUDGET = PickleBudget(bytes=64 * 1024 * 1024, ops=1 << 24, stack=1 << 20, memo=1 << 16,
                             words=1 << 25)
"""The budget of every pickle read from a checkpoint (a torch file's ``data.pkl``, a DCP
``.metadata``): 64 MiB, 16.8 million opcodes, a million stack items, 65,536 memo indexes ahead,
about 256 MiB of objects (2**25 words). A DCP ``.metadata`` of 128 storage items (25 KB) uses
13,713 opcodes and 85,557 words; a ``data.pkl`` about 30 opcodes and 200 words per tensor."""


class OverBudget(Exception):
    """A pickle refused by :func:`scan_pickle`. ``code``: ``schema_unsupported`` (over the
    budget, malformed) or ``size_mismatch`` (a length running past the end: cut short);
    ``detail`` says which limit and where."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


class ScanCost(NamedTuple):
    """What :func:`scan_pickle` counted: ``ops`` read (up to and with ``STOP``), the deepest
    ``stack`` (items and marks), and the estimated ``words``."""

    ops: int
    stack: int
    words: int


# argument kinds (pickletools' ArgumentDescriptor.n, and 9 for GLOBAL / INST's two lines)
_LINE, _LEN1, _LEN4S, _LEN4U, _LEN8, _PAIR = -1, -2, -3, -4, -5, 9
# effects
(_PUSH, _STR, _EMPTY, _FROM_MARK, _TUPLE_N, _ADD, _ADD_MARK, _POP, _POP_MARK, _DUP, _MARK,
 _PUT, _MEMOIZE, _GET, _GLOBAL, _STACK_GLOBAL, _INST, _OBJ, _REDUCE, _NEWOBJ, _NEWOBJ_EX,
 _BUILD, _PERSID, _BINPERSID, _FRAME, _NOTHING, _STOP, _BUFFER) = range(28)

#: opcode byte -> (name, argument kind, effect, words pushed, a number for the effect)
_SPEC: dict[int, tuple[str, int, int, int, int]] = {}


def _define() -> None:
    import pickletools

    # words an opcode costs by itself (a pointer and the object it pushes; 2 a memo entry);
    # the items a mark's opcodes add or a call copies are charged 5 each where they are read
    words = {"NONE": 1, "NEWTRUE": 1, "NEWFALSE": 1, "EMPTY_TUPLE": 1, "BINFLOAT": 4,
             "FLOAT": 4, "EMPTY_LIST": 8, "EMPTY_DICT": 9, "EMPTY_SET": 28, "PROTO": 0,
             "FRAME": 0, "STOP": 0, "POP": 0, "POP_MARK": 0, "MARK": 1, "DUP": 1, "GET": 1,
             "BINGET": 1, "LONG_BINGET": 1, "PUT": 2, "BINPUT": 2, "LONG_BINPUT": 2,
             "MEMOIZE": 2, "APPENDS": 0, "SETITEMS": 0, "ADDITEMS": 0}
    effect = {
        "STRING": _STR, "BINSTRING": _STR, "SHORT_BINSTRING": _STR, "BINBYTES": _STR,
        "SHORT_BINBYTES": _STR, "BINBYTES8": _STR, "BYTEARRAY8": _STR, "UNICODE": _STR,
        "SHORT_BINUNICODE": _STR, "BINUNICODE": _STR, "BINUNICODE8": _STR,
        "EMPTY_LIST": _EMPTY, "EMPTY_DICT": _EMPTY, "EMPTY_SET": _EMPTY,
        "LIST": _FROM_MARK, "TUPLE": _FROM_MARK, "DICT": _FROM_MARK, "FROZENSET": _FROM_MARK,
        "TUPLE1": _TUPLE_N, "TUPLE2": _TUPLE_N, "TUPLE3": _TUPLE_N,
        "APPEND": _ADD, "SETITEM": _ADD, "APPENDS": _ADD_MARK, "SETITEMS": _ADD_MARK,
        "ADDITEMS": _ADD_MARK, "POP": _POP, "POP_MARK": _POP_MARK, "DUP": _DUP, "MARK": _MARK,
        "PUT": _PUT, "BINPUT": _PUT, "LONG_BINPUT": _PUT, "MEMOIZE": _MEMOIZE,
        "GET": _GET, "BINGET": _GET, "LONG_BINGET": _GET, "GLOBAL": _GLOBAL,
        "EXT1": _GLOBAL, "EXT2": _GLOBAL, "EXT4": _GLOBAL, "STACK_GLOBAL": _STACK_GLOBAL,
        "INST": _INST, "OBJ": _OBJ, "REDUCE": _REDUCE, "NEWOBJ": _NEWOBJ,
        "NEWOBJ_EX": _NEWOBJ_EX, "BUILD": _BUILD, "PERSID": _PERSID, "BINPERSID": _BINPERSID,
        "FRAME": _FRAME, "PROTO": _NOTHING, "STOP": _STOP, "NEXT_BUFFER": _BUFFER,
        "READONLY_BUFFER": _BUFFER,
    }
    #: how many stack items an effect takes (TUPLE1..3), or how a mark's items count (DICT and
    #: SETITEMS: pairs)
    number = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "APPEND": 1, "SETITEM": 2, "DICT": 2,
              "SETITEMS": 2, "LIST": 1, "TUPLE": 1, "FROZENSET": 1, "APPENDS": 1,
              "ADDITEMS": 1}
    for op in pickletools.opcodes:
        kind = 0 if op.arg is None else op.arg.n
        if op.name in ("GLOBAL", "INST"):
            kind = _PAIR
        _SPEC[ord(op.code.encode("latin-1"))] = (op.name, kind, effect.get(op.name, _PUSH),
                                                 words.get(op.name, 5), number.get(op.name, 0))


_define()
_INLINE = {"MEMOIZE": 1, "BINGET": 2, "LONG_BINGET": 3, "TUPLE1": 4, "NONE": 5, "EMPTY_TUPLE": 5,
           "NEWFALSE": 5, "NEWTRUE": 5, "MARK": 6, "BININT1": 7, "NEWOBJ": 8, "BUILD": 9,
           "EMPTY_DICT": 10, "EMPTY_LIST": 10, "EMPTY_SET": 10, "SETITEMS": 11, "REDUCE": 12,
           "SHORT_BINUNICODE": 13, "SHORT_BINBYTES": 13, "SHORT_BINSTRING": 13}
#: per byte (and 256: past the end): the inline case of :meth:`_Scan._run` (0: a method), and
#: the words its opcode pushes
_FAST = [_INLINE.get(_SPEC[b][0], 0) if b in _SPEC else 0 for b in range(257)]
_WORDS = [_SPEC[b][3] if b in _SPEC else 0 for b in range(257)]


def scan_pickle(data: bytes | memoryview, budget: PickleBudget = PICKLE_BUDGET) -> ScanCost:
    """Read the opcodes of ``data`` (a whole pickle) up to its ``STOP`` without building
    anything, and return what reading it would cost (:class:`ScanCost`). Raises
    :class:`OverBudget` when it exceeds ``budget`` (which limit, at which byte) or could not be
    read (module doc). Bytes after ``STOP`` are not looked at (the unpickler stops there)."""
    if len(data) > budget.bytes:
        raise OverBudget("schema_unsupported", f"{len(data)} bytes, over the {budget.bytes} a "
                                               "pickle may have here: not read")
    return _Scan(bytes(data) if isinstance(data, memoryview) else data, budget).run()


class _Scan:
    """One pass of :func:`scan_pickle` (its state, one method per kind of effect)."""

    def __init__(self, data: bytes, budget: PickleBudget):
        self.data, self.budget = data, budget
        self.stack: list[int] = []
        self.marks: list[int] = []
        self.memo: dict[int, int] = {}
        self.sizes = [0]           # per container id: its length (id 0: every scalar)
        self.kids: dict[int, list[int]] = {}  # per tuple id: the ids inside it
        #: per tuple id: the items hashing it reads (itself and the tuples inside, at depth)
        self.hashing: dict[int, int] = {}
        self.words = 0
        self.deepest = 0
        self.stopped = False

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> ScanCost:
        try:
            return self._run()
        except IndexError:  # a pop from an empty stack (the unpickler refuses it there)
            raise OverBudget("schema_unsupported", "stack underflow: not a well-formed pickle"
                             ) from None
        except KeyError as e:
            raise OverBudget("schema_unsupported", f"memo slot {e} read but never set: not a "
                                                   "well-formed pickle") from None

    def _run(self) -> ScanCost:
        """The loop: the opcodes frequent in checkpoints handled inline (a ``.metadata`` is
        mostly MEMOIZE, BINGET, TUPLE1, NEWOBJ, BUILD, SETITEMS, REDUCE), the others by one
        method per effect."""
        data, fast, weight, n = self.data, _FAST, _WORDS, len(self.data)
        stack, memo, sizes, kids, marks = self.stack, self.memo, self.sizes, self.kids, self.marks
        hashing = self.hashing.get
        push, new = stack.append, sizes.append
        effects = self._effects()
        p = ops = words = 0
        check_at = 4096
        while True:
            b = data[p] if p < n else 256
            f = fast[b]
            words += weight[b]
            ops += 1
            if f == 1:  # MEMOIZE
                memo[len(memo)] = stack[-1]
                p += 1
            elif f == 2:  # BINGET
                push(memo[data[p + 1]])
                p += 2
            elif f == 3:  # LONG_BINGET
                push(memo[int.from_bytes(data[p + 1:p + 5], "little")])
                p += 5
            elif f == 4:  # TUPLE1
                new(1)
                kids[len(sizes) - 1] = [stack[-1]]
                self.hashing[len(sizes) - 1] = 1 + hashing(stack[-1], 0)
                stack[-1] = len(sizes) - 1
                p += 1
            elif f == 5:  # NONE, EMPTY_TUPLE, NEWFALSE, NEWTRUE
                push(0)
                p += 1
            elif f == 6:  # MARK
                marks.append(len(stack))
                p += 1
            elif f == 7:  # BININT1
                push(0)
                p += 2
            elif f == 8:  # NEWOBJ: cls.__new__(cls, *args)
                words += 5 * sizes[stack.pop()]
                stack[-1] = len(sizes)
                new(0)
                p += 1
            elif f == 9:  # BUILD: the state copied into the object
                state = stack.pop()
                words += 5 * (sizes[state] + sum(sizes[i] for i in kids.get(state, ())))
                p += 1
            elif f == 10:  # EMPTY_DICT, EMPTY_LIST, EMPTY_SET
                new(0)
                push(len(sizes) - 1)
                p += 1
            elif f == 11:  # SETITEMS (a key that is a tuple is hashed: charged as read)
                at = marks.pop()
                k = len(stack) - at
                words += 5 * (k + sum(hashing(key, 0) for key in stack[at::2]))
                del stack[at:]
                sizes[stack[-1]] += k >> 1
                p += 1
            elif f == 12:  # REDUCE: callable(*args), tuple(x) / set(x) copy x
                args = stack.pop()
                copied = sizes[args] + sum(sizes[i] for i in kids.get(args, ()))
                words += 5 * copied
                stack[-1] = len(sizes)
                new(copied)
                p += 1
            elif f == 13:  # SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING
                k = data[p + 1] if p + 1 < n else n
                p += 2 + k
                if p > n:
                    raise OverBudget("size_mismatch", f"{k} bytes declared at byte {p - k - 1},"
                                                      f" the pickle ends at {n}: cut short")
                words += 2 + (k >> 3)
                new(k)
                push(len(sizes) - 1)
            else:
                self.words = words
                p = self._other(b, p, n, effects)
                words = self.words
                if self.stopped:
                    break
            if ops >= check_at:
                self.words = words
                self._check(ops, p)
                check_at = ops + 4096
        self.words = words
        self._check(ops, p)
        return ScanCost(ops, self.deepest, self.words)

    def _effects(self) -> tuple[Callable[[int, int, str, int], None], ...]:
        return (self._push, self._str, self._empty, self._from_mark, self._tuple_n,
                self._add, self._add_mark, self._pop, self._pop_mark, self._dup, self._mark,
                self._put, self._memoize, self._get, self._global, self._stack_global,
                self._inst, self._obj, self._reduce, self._newobj, self._newobj_ex,
                self._build, self._persid, self._binpersid, self._frame, self._nothing,
                self._stop, self._buffer)

    def _other(self, b: int, p: int, n: int,
               effects: tuple[Callable[[int, int, str, int], None], ...]) -> int:
        """One opcode by its effect's method; returns the position after it."""
        got = _SPEC.get(b)
        if got is None:
            self._unknown(p, n)
        name, kind, effect, _, number = got
        end, arg = self._arg(kind, p + 1, n) if kind else (p + 1, 0)
        effects[effect](arg, number, name, p)
        return end

    def _unknown(self, p: int, n: int) -> NoReturn:
        if p >= n:
            raise OverBudget("size_mismatch", f"the pickle ends at byte {n} without STOP: "
                                              "cut short")
        raise OverBudget("schema_unsupported", f"unknown opcode {self.data[p]:#04x} at byte {p}")

    def _check(self, ops: int, p: int) -> None:
        depth = len(self.stack) + len(self.marks)
        self.deepest = max(self.deepest, depth)
        b = self.budget
        if ops > b.ops:
            raise OverBudget("schema_unsupported", f"over {b.ops} opcodes (byte {p}): not read")
        if depth > b.stack:
            raise OverBudget("schema_unsupported", f"{depth} items on the stack after {ops} "
                                                   f"opcodes (byte {p}), over the {b.stack} "
                                                   "allowed: not read")
        if self.words > b.words:
            raise OverBudget("schema_unsupported", f"about {self.words * 8} bytes of objects "
                                                   f"after {ops} opcodes (byte {p}), over the "
                                                   f"{b.words * 8} allowed: not read")

    def _arg(self, kind: int, p: int, n: int) -> tuple[int, int]:
        """The position after an argument and its value (an integer; a length for strings and
        bytes; the line's number for PUT / GET; 0 for other lines)."""
        data = self.data
        if kind > 0 and kind != _PAIR:
            end = p + kind
            if end > n:
                raise OverBudget("size_mismatch", f"the pickle ends inside an argument at byte "
                                                  f"{p}: cut short")
            return end, int.from_bytes(data[p:end], "little", signed=kind == 4 and data[p - 1]
                                       in (0x4a, 0x84))  # BININT and EXT4 are signed
        if kind in (_LINE, _PAIR):
            end = data.find(b"\n", p)
            if kind == _PAIR and end >= 0:
                end = data.find(b"\n", end + 1)
            if end < 0:
                raise OverBudget("size_mismatch", f"a line that never ends, from byte {p}")
            line = data[p:end]
            return end + 1, int(line) if data[p - 1] in (0x67, 0x70) and line.isdigit() else 0
        width = {_LEN1: 1, _LEN4S: 4, _LEN4U: 4, _LEN8: 8}[kind]
        if p + width > n:
            raise OverBudget("size_mismatch", f"the pickle ends inside a length at byte {p}")
        length = int.from_bytes(data[p:p + width], "little", signed=kind == _LEN4S)
        if length < 0 or p + width + length > n:
            raise OverBudget("size_mismatch", f"{length} bytes declared at byte {p}, "
                                              f"{n - p - width} left: cut short")
        return p + width + length, length

    # --- the stack -----------------------------------------------------------------------------

    def _new(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes) - 1

    def _take(self, k: int, start: int) -> list[int]:
        stack = self.stack
        floor = self.marks[-1] if self.marks else 0
        if len(stack) - k < floor:
            raise OverBudget("schema_unsupported", f"stack underflow at byte {start}")
        got = stack[len(stack) - k:]
        del stack[len(stack) - k:]
        return got

    def _to_mark(self, start: int) -> list[int]:
        if not self.marks:
            raise OverBudget("schema_unsupported", f"no MARK for the opcode at byte {start}")
        at = self.marks.pop()
        got = self.stack[at:]
        del self.stack[at:]
        return got

    def _top(self, start: int) -> int:
        floor = self.marks[-1] if self.marks else 0
        if len(self.stack) <= floor:
            raise OverBudget("schema_unsupported", f"stack underflow at byte {start}")
        return self.stack[-1]

    def _copied(self, ids: list[int]) -> int:
        """Items a call copies out of these containers (charged 5 words each)."""
        total = 0
        for i in ids:
            total += self.sizes[i]
        self.words += 5 * total
        return total

    # --- the effects (argument, number, name, byte) --------------------------------------------

    def _push(self, arg: int, number: int, name: str, start: int) -> None:
        self.stack.append(0)

    def _str(self, arg: int, number: int, name: str, start: int) -> None:
        self.words += 2 + (arg >> 3)
        self.stack.append(self._new(arg))

    def _empty(self, arg: int, number: int, name: str, start: int) -> None:
        self.stack.append(self._new(0))

    def _hashed(self, keys: list[int]) -> None:
        """Charge hashing ``keys`` (a dict's keys, a set's items): a tuple reads its items."""
        got = self.hashing.get
        self.words += 5 * sum(got(k, 0) for k in keys)

    def _tuple(self, items: list[int]) -> int:
        new = self._new(len(items))
        self.kids[new] = items
        got = self.hashing.get
        self.hashing[new] = min(len(items) + sum(got(i, 0) for i in items), 1 << 62)
        return new

    def _from_mark(self, arg: int, number: int, name: str, start: int) -> None:
        items = self._to_mark(start)
        self.words += 5 * len(items)
        if name == "TUPLE":
            self.stack.append(self._tuple(items))
            return
        if name != "LIST":  # DICT, FROZENSET: their keys hashed
            self._hashed(items[::number])
        self.stack.append(self._new(len(items) // number))

    def _tuple_n(self, arg: int, number: int, name: str, start: int) -> None:
        self.stack.append(self._tuple(self._take(number, start)))

    def _add(self, arg: int, number: int, name: str, start: int) -> None:
        items = self._take(number, start)
        if number == 2:  # SETITEM
            self._hashed(items[:1])
        self.sizes[self._top(start)] += 1

    def _add_mark(self, arg: int, number: int, name: str, start: int) -> None:
        items = self._to_mark(start)
        self.words += 5 * len(items)
        if name != "APPENDS":  # SETITEMS, ADDITEMS: their keys hashed
            self._hashed(items[::number])
        self.sizes[self._top(start)] += len(items) // number

    def _pop(self, arg: int, number: int, name: str, start: int) -> None:
        if self.marks and len(self.stack) == self.marks[-1]:
            self.marks.pop()  # POP at a mark pops the mark (the C unpickler's rule)
        else:
            self._take(1, start)

    def _pop_mark(self, arg: int, number: int, name: str, start: int) -> None:
        self._to_mark(start)

    def _dup(self, arg: int, number: int, name: str, start: int) -> None:
        self.stack.append(self._top(start))

    def _mark(self, arg: int, number: int, name: str, start: int) -> None:
        self.marks.append(len(self.stack))

    def _put(self, arg: int, number: int, name: str, start: int) -> None:
        if arg > len(self.memo) + self.budget.memo:
            raise OverBudget("schema_unsupported", f"memo index {arg} at byte {start}, with "
                                                   f"{len(self.memo)} set: not read")
        self.memo[arg] = self._top(start)

    def _memoize(self, arg: int, number: int, name: str, start: int) -> None:
        self._put(len(self.memo), number, name, start)

    def _get(self, arg: int, number: int, name: str, start: int) -> None:
        got = self.memo.get(arg)
        if got is None:
            raise OverBudget("schema_unsupported", f"memo slot {arg} read at byte {start} was "
                                                   "never set")
        self.stack.append(got)

    def _global(self, arg: int, number: int, name: str, start: int) -> None:
        self.stack.append(self._new(0))

    def _stack_global(self, arg: int, number: int, name: str, start: int) -> None:
        self._take(2, start)
        self.stack.append(self._new(0))

    def _inst(self, arg: int, number: int, name: str, start: int) -> None:
        items = self._to_mark(start)
        self.stack.append(self._new(self._copied(items) + len(items)))

    def _obj(self, arg: int, number: int, name: str, start: int) -> None:
        self._inst(arg, number, name, start)

    def _reduce(self, arg: int, number: int, name: str, start: int) -> None:
        args = self._take(2, start)[1]
        copied = self._copied([args, *self.kids.get(args, ())])
        self.stack.append(self._new(copied))  # tuple(x), list(x): as long as x

    def _newobj(self, arg: int, number: int, name: str, start: int) -> None:
        args = self._take(2, start)[1]
        self._copied([args])
        self.stack.append(self._new(0))

    def _newobj_ex(self, arg: int, number: int, name: str, start: int) -> None:
        got = self._take(3, start)
        self._copied(got[1:])
        self.stack.append(self._new(0))

    def _build(self, arg: int, number: int, name: str, start: int) -> None:
        state = self._take(1, start)[0]
        self._copied([state, *self.kids.get(state, ())])  # a dict, or (dict, slots)
        self._top(start)

    def _persid(self, arg: int, number: int, name: str, start: int) -> None:
        self.stack.append(self._new(0))

    def _binpersid(self, arg: int, number: int, name: str, start: int) -> None:
        self._take(1, start)
        self.stack.append(self._new(0))

    def _frame(self, arg: int, number: int, name: str, start: int) -> None:
        if start + 9 + arg > len(self.data):
            raise OverBudget("size_mismatch", f"a frame of {arg} bytes at byte {start}, "
                                              f"{len(self.data) - start - 9} left: cut short")

    def _nothing(self, arg: int, number: int, name: str, start: int) -> None:
        pass

    def _stop(self, arg: int, number: int, name: str, start: int) -> None:
        self._take(1, start)
        self.stopped = True

    def _buffer(self, arg: int, number: int, name: str, start: int) -> None:
        raise OverBudget("schema_unsupported", f"{name} at byte {start}: out-of-band buffers "
                                               "are not read")
