"""GNU diff's choice of changed lines (diffutils' analyze.c and gnulib's diffseq.h), so that the
sim's ``diff`` cuts its hunks where GNU diff does when several minimal edit scripts exist.

Three steps, as GNU: lines that match nothing in the other file are discarded before the search
(with GNU's rules for lines that match very often); the middle-snake divide and conquer of Myers'
O(ND) algorithm marks the changed lines; runs of changes are then slid to merge with neighbours
and to line up with the other file's changes.
"""

from __future__ import annotations


def _classes(a: list[str], b: list[str]) -> tuple[list[int], list[int], int]:
    ids: dict[str, int] = {}
    ea = [ids.setdefault(x, len(ids) + 1) for x in a]
    eb = [ids.setdefault(x, len(ids) + 1) for x in b]
    return ea, eb, len(ids) + 1


def _provisional_runs(discards: list[int]) -> None:
    """Keep provisional discards (lines matching many others) only inside runs of real ones."""
    end, i = len(discards), 0
    while i < end:
        if discards[i] == 2:
            discards[i] = 0
        elif discards[i]:
            j, provisional = i, 0
            while j < end and discards[j]:
                provisional += discards[j] == 2
                j += 1
            while j > i and discards[j - 1] == 2:
                j -= 1
                discards[j] = 0
                provisional -= 1
            length = j - i
            if provisional * 4 > length:
                for k in range(i, j):
                    if discards[k] == 2:
                        discards[k] = 0
            else:
                _trim_run(discards, i, length)
                i += length - 1
        i += 1


def _trim_run(discards: list[int], i: int, length: int) -> None:
    minimum, tem = 1, length >> 2
    while (tem := tem >> 2) > 0:
        minimum <<= 1
    minimum += 1
    j = consec = 0
    while j < length:
        if discards[i + j] != 2:
            consec = 0
        else:
            consec += 1
            if consec == minimum:
                j -= consec
            elif consec > minimum:
                discards[i + j] = 0
        j += 1
    for step in (1, -1):
        start = i if step == 1 else i + length - 1
        consec = 0
        for j in range(length):
            k = start + step * j
            if j >= 8 and discards[k] == 1:
                break
            if discards[k] == 2:
                consec, discards[k] = 0, 0
            elif discards[k] == 0:
                consec = 0
            else:
                consec += 1
            if consec == 3:
                break


def _discards(equivs: list[int], other_count: list[int]) -> list[int]:
    many, tem = 5, len(equivs) // 64
    while (tem := tem >> 2) > 0:
        many *= 2
    out = [1 if other_count[e] == 0 else 2 if other_count[e] > many else 0 for e in equivs]
    _provisional_runs(out)
    return out


class _Search:
    """Myers' middle-snake search over the undiscarded lines, marking ``changed``."""

    def __init__(self, xv, yv, xreal, yreal, changed0, changed1) -> None:
        self.xv, self.yv, self.xreal, self.yreal = xv, yv, xreal, yreal
        self.changed0, self.changed1 = changed0, changed1
        self.fd: dict[int, int] = {}
        self.bd: dict[int, int] = {}

    def diag(self, xoff: int, xlim: int, yoff: int, ylim: int) -> tuple[int, int]:
        xv, yv, fd, bd = self.xv, self.yv, self.fd, self.bd
        dmin, dmax, fmid, bmid = xoff - ylim, xlim - yoff, xoff - yoff, xlim - ylim
        fmin = fmax = fmid
        bmin = bmax = bmid
        odd = (fmid - bmid) & 1
        fd[fmid], bd[bmid] = xoff, xlim
        while True:
            if fmin > dmin:
                fmin -= 1
                fd[fmin - 1] = -1
            else:
                fmin += 1
            if fmax < dmax:
                fmax += 1
                fd[fmax + 1] = -1
            else:
                fmax -= 1
            for d in range(fmax, fmin - 1, -2):
                tlo, thi = fd[d - 1], fd[d + 1]
                x = thi if tlo < thi else tlo + 1
                y = x - d
                while x < xlim and y < ylim and xv[x] == yv[y]:
                    x, y = x + 1, y + 1
                fd[d] = x
                if odd and bmin <= d <= bmax and bd[d] <= x:
                    return x, y
            big = 1 << 62
            if bmin > dmin:
                bmin -= 1
                bd[bmin - 1] = big
            else:
                bmin += 1
            if bmax < dmax:
                bmax += 1
                bd[bmax + 1] = big
            else:
                bmax -= 1
            for d in range(bmax, bmin - 1, -2):
                tlo, thi = bd[d - 1], bd[d + 1]
                x = tlo if tlo < thi else thi - 1
                y = x - d
                while xoff < x and yoff < y and xv[x - 1] == yv[y - 1]:
                    x, y = x - 1, y - 1
                bd[d] = x
                if not odd and fmin <= d <= fmax and x <= fd[d]:
                    return x, y

    def compare(self, xoff: int, xlim: int, yoff: int, ylim: int) -> None:
        stack = [(xoff, xlim, yoff, ylim)]
        while stack:
            xoff, xlim, yoff, ylim = stack.pop()
            while xoff < xlim and yoff < ylim and self.xv[xoff] == self.yv[yoff]:
                xoff, yoff = xoff + 1, yoff + 1
            while xoff < xlim and yoff < ylim and self.xv[xlim - 1] == self.yv[ylim - 1]:
                xlim, ylim = xlim - 1, ylim - 1
            if xoff == xlim:
                for y in range(yoff, ylim):
                    self.changed1[self.yreal[y] + 1] = 1
            elif yoff == ylim:
                for x in range(xoff, xlim):
                    self.changed0[self.xreal[x] + 1] = 1
            else:
                xmid, ymid = self.diag(xoff, xlim, yoff, ylim)
                stack.append((xmid, xlim, ymid, ylim))
                stack.append((xoff, xmid, yoff, ymid))


def _shift_boundaries(changed: list[int], other: list[int], equivs: list[int]) -> None:
    """GNU's shift_boundaries; ``changed``/``other`` carry a 0 sentinel at each end (index 0 is
    line -1)."""
    n = len(equivs)
    i = j = 0

    def ch(k: int) -> int:
        return changed[k + 1]

    while True:
        while i < n and not ch(i):
            while other[j + 1]:
                j += 1
            j += 1
            i += 1
        if i == n:
            return
        start = i
        i += 1
        while ch(i):
            i += 1
        while other[j + 1]:
            j += 1
        while True:
            runlength = i - start
            while start and equivs[start - 1] == equivs[i - 1]:
                start -= 1
                changed[start + 1] = 1
                i -= 1
                changed[i + 1] = 0
                while ch(start - 1):
                    start -= 1
                j -= 1
                while other[j + 1]:
                    j -= 1
            corresponding = i if other[j] else n
            while i != n and equivs[start] == equivs[i]:
                changed[start + 1] = 0
                start += 1
                changed[i + 1] = 1
                i += 1
                while ch(i):
                    i += 1
                j += 1
                while other[j + 1]:
                    j += 1
                    corresponding = i
            if runlength == i - start:
                break
        while corresponding < i:
            start -= 1
            changed[start + 1] = 1
            i -= 1
            changed[i + 1] = 0
            j -= 1
            while other[j + 1]:
                j -= 1


def opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib-style opcodes for the edit script GNU diff would print."""
    ea, eb, nclasses = _classes(a, b)
    count_a, count_b = [0] * nclasses, [0] * nclasses
    for e in ea:
        count_a[e] += 1
    for e in eb:
        count_b[e] += 1
    da, db = _discards(ea, count_b), _discards(eb, count_a)
    changed0, changed1 = [0] * (len(a) + 2), [0] * (len(b) + 2)
    xreal = [k for k, d in enumerate(da) if not d]
    yreal = [k for k, d in enumerate(db) if not d]
    for k, d in enumerate(da):
        changed0[k + 1] = d and 1
    for k, d in enumerate(db):
        changed1[k + 1] = d and 1
    search = _Search([ea[k] for k in xreal], [eb[k] for k in yreal], xreal, yreal, changed0, changed1)
    search.compare(0, len(xreal), 0, len(yreal))
    _shift_boundaries(changed0, changed1, ea)
    _shift_boundaries(changed1, changed0, eb)
    return _script(changed0, changed1, len(a), len(b))


def _script(changed0: list[int], changed1: list[int], n0: int, n1: int) -> list[tuple[str, int, int, int, int]]:
    ops: list[tuple[str, int, int, int, int]] = []
    i0 = i1 = 0
    eq0 = eq1 = 0
    while i0 < n0 or i1 < n1:
        if changed0[i0 + 1] or changed1[i1 + 1]:
            line0, line1 = i0, i1
            while changed0[i0 + 1]:
                i0 += 1
            while changed1[i1 + 1]:
                i1 += 1
            if eq0 < line0:
                ops.append(("equal", eq0, line0, eq1, line1))
            tag = "replace" if i0 > line0 and i1 > line1 else "delete" if i0 > line0 else "insert"
            ops.append((tag, line0, i0, line1, i1))
            eq0, eq1 = i0, i1
        i0, i1 = i0 + 1, i1 + 1
    if eq0 < n0:
        ops.append(("equal", eq0, n0, eq1, n1))
    return ops
