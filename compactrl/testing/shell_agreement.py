"""Random command lines over random file trees, run in the emulator and in real bash, compared.

A test harness, not part of the emulator: used by ``tests/terminal/test_shell_agreement.py``
(property-based, via hypothesis' ``randoms``) and ``benchmarks/shell_agreement.py`` (the measured
agreement rate). Real bash runs in a fresh
temporary directory with ``LC_ALL=C.UTF-8``, ``HOME`` set to that directory, stdin from
``/dev/null`` and a timeout; the emulator gets the same files and the same root path.

Commands whose real output order depends on the file system's directory order (``find``,
``grep -r``, ``awk``'s ``for (k in a)``) are always piped through ``sort`` by the generator:
docs/terminal.md lists that as a disagreement class of the unsorted forms.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass

from compactrl.shell_sim import ShellEmulator

WORDS = ["alpha", "beta", "gamma", "delta", "ERROR", "WARN", "INFO", "error", "disk", "cpu", "user",
         "x", "y", "foo", "bar", "baz", "42", "7", "100", "3.5", "-2", "0", "key", "value", "Alpha", "é"]
DIRS = ["logs", "data", "conf", "src", "logs/old", "data/raw"]
NAMES = ["a.txt", "b.log", "c.csv", "notes", "app.log", "x.conf", "readme.md", "z-1.txt", "B.txt", "my file.txt",
         "données.csv", "it's.log"]


@dataclass
class Case:
    files: dict[str, str]
    dirs: list[str]
    command: str


@dataclass
class Outcome:
    stdout: str
    stderr: str
    exit_code: int
    files: dict[str, str]
    dirs: set[str]


# ===================================================================== random trees
def _line(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return f"2024-01-{rng.randint(1, 28):02d} {rng.choice(['ERROR', 'WARN', 'INFO'])} " \
               f"{rng.choice(['disk', 'cpu', 'net'])}: code={rng.randint(0, 300)}"
    if kind == 1:
        return ",".join(str(rng.choice(WORDS[:10] + [str(rng.randint(-5, 200))])) for _ in range(rng.randint(2, 4)))
    if kind == 2:
        return f"{rng.choice(['key', 'port', 'host', 'mode'])}={rng.choice(WORDS)}"
    if kind == 3:
        return ""
    if kind == 4:
        sep = rng.choice([" ", "  ", "\t", " "])
        return sep.join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    return f"{rng.randint(0, 999)} {rng.choice(WORDS)}"


def random_tree(rng: random.Random) -> tuple[dict[str, str], list[str]]:
    dirs = sorted(set(rng.sample(DIRS, rng.randint(0, 4))))
    dirs = sorted({d for d in dirs} | {d.rsplit("/", 1)[0] for d in dirs if "/" in d})
    files: dict[str, str] = {}
    for _ in range(rng.randint(1, 6)):
        parent = rng.choice([""] + dirs)
        name = rng.choice(NAMES)
        path = f"{parent}/{name}" if parent else name
        if path in dirs:
            continue
        lines = [_line(rng) for _ in range(rng.randint(0, 12))]
        text = "\n".join(lines)
        if lines and rng.random() < 0.85:
            text += "\n"
        files[path] = text
    empty = [d for d in dirs if not any(f.startswith(d + "/") for f in files)]
    return files, empty


# ===================================================================== random commands
class CommandGen:
    """Draws command lines from the documented subset, aimed at the given tree."""

    def __init__(self, rng: random.Random, files: dict[str, str], dirs: list[str]) -> None:
        self.rng = rng
        self.files = sorted(files)
        self.dirs = sorted(set(dirs) | {f.rsplit("/", 1)[0] for f in files if "/" in f})
        self.words = sorted({w for text in files.values() for w in text.split() if w.isascii()} | {"ERROR", "x"})

    def file(self, missing_p: float = 0.08) -> str:
        if not self.files or self.rng.random() < missing_p:
            return self.rng.choice(["missing.txt", "nodir/x", "logs/none.log"])
        return self.q(self.rng.choice(self.files))

    def q(self, text: str) -> str:
        return shlex.quote(text)

    def word(self) -> str:
        return self.rng.choice(self.words)

    def pattern(self, extended: bool = False) -> str:
        w = self.word()
        r = self.rng.random()
        if r < 0.4:
            return self.q(w[: self.rng.randint(1, len(w))])
        if r < 0.55:
            return self.q("^" + w)
        if r < 0.65:
            return self.q(w + "$")
        if r < 0.8:
            return self.q(self.rng.choice(["[0-9]", "[A-Z]", "[a-z]+" if extended else "[a-z]*", "[[:digit:]]",
                                           "[^ ]*=", "e.r", ".*"]))
        if extended:
            return self.q(self.rng.choice(["(ERROR|WARN)", "[0-9]{2,}", "^[a-z]+=", "o+", "a|b"]))
        return self.q(self.rng.choice(["ERROR\\|WARN", "[0-9]\\{2,\\}", "^[a-z]*=", "o\\+"]))

    def source(self) -> str:
        """A command that produces output from files."""
        g = self.rng.choice([self.cat, self.grep, self.head_tail, self.sort, self.cut, self.sed, self.awk,
                             self.wc, self.find, self.ls, self.echo, self.printf, self.seq, self.grep_r])
        return g()

    def filt(self) -> str:
        """A command that reads stdin."""
        r = self.rng.randrange(12)
        table = {
            0: ["grep " + o + self.pattern() for o in ["", "-v ", "-i ", "-c ", "-n ", "-o ", "-E "]],
            1: ["sort " + o for o in ["", "-r", "-n", "-u", "-nr", "-k2", "-k2,2n", "-t, -k2", "-f", "-k1,1 -s"]],
            2: ["uniq " + o for o in ["", "-c", "-d", "-u", "-i"]],
            3: ["head " + o for o in ["-n 3", "-1", "-n -2", "-c 10", ""]],
            4: ["tail " + o for o in ["-n 2", "-1", "-n +3", "-c 5", ""]],
            5: ["wc " + o for o in ["-l", "-w", "-c", "", "-m", "-lw"]],
            6: ["cut " + o for o in ["-d, -f1", "-d, -f2-", "-c1-5", "-f1", "-d= -f2", '-d" " -f1,3', "-b2-"]],
            7: ["tr " + o for o in ["a-z A-Z", "-d 0-9", '-s " "', "'[:lower:]' '[:upper:]'", "-cd 'a-z\\n'",
                                    ', " "']],
            8: ["sed " + o for o in ["s/a/A/", "s/[0-9]/N/g", "-n 2p", "1d", "'s/=.*//'", "-E 's/(x|y)/<\\1>/g'",
                                     "'$d'", "/ERROR/d"]],
            9: ["awk " + o for o in self.awk_programs()],
            10: ["cat", "cat -n", "cat -"],
            11: ["sort | uniq -c | sort -rn"],
        }
        return self.rng.choice(table[r])

    def awk_programs(self) -> list[str]:
        return ["'{print $1}'", "'{print NF}'", "'{s+=$1} END{print s+0}'", "'NR%2==1'", "'{print NR\": \"$0}'",
                "-F, '{print $2}'", "'length($0) > 10'", "'{print $NF}'", "'$1 ~ /^[0-9]+$/ {n++} END{print n+0}'",
                "'{printf \"%-5s|%3d\\n\", $1, NR}'", "-F= '{print $1}'", "'{ $2 = \"X\"; print }'",
                "'BEGIN{OFS=\"-\"} {$1=$1; print}'", "'{print toupper($1), length($1)}'",
                "'{c[$1]++} END{for (k in c) print k, c[k]}' | sort", "'/ERROR/ {print $2}'",
                "'{x = substr($0, 2, 3); print x}'", "'NF > 2 {print $3 * 2}'", "'{print $1 + 0.5}'"]

    def cat(self) -> str:
        return f"cat {' '.join(self.file() for _ in range(self.rng.randint(1, 2)))}"

    def grep(self) -> str:
        ext = self.rng.random() < 0.3
        opts = self.rng.choice(["", "-v ", "-i ", "-c ", "-n ", "-l ", "-h ", "-w ", "-x ", "-o ", "-in ", "-L ",
                                "-A1 ", "-B1 ", "-m2 ", "-q ", "-s ", "-F "])
        files = " ".join(self.file() for _ in range(self.rng.randint(1, 3)))
        return f"grep {'-E ' if ext else ''}{opts}{self.pattern(ext)} {files}"

    def grep_r(self) -> str:
        target = self.rng.choice(["."] + self.dirs) if self.dirs else "."
        opts = self.rng.choice(["-r", "-rl", "-rc", "-rn", "-rh", "-ri"])
        inc = self.rng.choice(["", " --include='*.log'"])
        return f"grep {opts}{inc} {self.pattern()} {target} | sort"

    def head_tail(self) -> str:
        cmd = self.rng.choice(["head", "tail"])
        opt = self.rng.choice(["", "-n 2 ", "-3 ", "-c 7 ", "-n +2 " if cmd == "tail" else "-n -2 ", "-q ", "-v "])
        files = " ".join(self.file() for _ in range(self.rng.randint(1, 2)))
        return f"{cmd} {opt}{files}"

    def sort(self) -> str:
        opts = self.rng.choice(["", "-r ", "-n ", "-u ", "-k2 ", "-k2n ", "-t, -k2,2 ", "-f ", "-b ", "-rn ",
                                "-k1.2 ", "-s -k2,2 ", "-t= -k2 "])
        return f"sort {opts}{self.file()}"

    def cut(self) -> str:
        spec = self.rng.choice(["-d, -f1", "-d, -f1,3", "-d= -f2", "-c1-3", "-f2", "-d' ' -f2-", "-s -d, -f2",
                                "-d, --complement -f1", "-b3"])
        return f"cut {spec} {self.file()}"

    def sed(self) -> str:
        script = self.rng.choice(["s/e/E/", "s/[0-9][0-9]*/#/g", "-n '/=/p'", "2,4d", "'s/^/> /'", "-n '$p'",
                                  "'s/\\(.*\\)=\\(.*\\)/\\2=\\1/'", "-E 's/([a-z]+)/[\\1]/2'", "'/^$/d'", "=",
                                  "'1~2d'", "-n '2{p;p}'", "'y/abc/ABC/'", "'2q'", "'s/a/b/w out.txt'",
                                  "'$a\\\nEND'", "'1i\\\nSTART'", "-e 's/x/y/' -e 's/y/z/'", "'/ERROR/,/INFO/d'"])
        return f"sed {script} {self.file()}"

    def awk(self) -> str:
        return f"awk {self.rng.choice(self.awk_programs())} {self.file()}"

    def wc(self) -> str:
        opts = self.rng.choice(["", "-l ", "-w ", "-c ", "-lc ", "-m "])
        files = " ".join(self.file() for _ in range(self.rng.randint(1, 3)))
        return f"wc {opts}{files}"

    def find(self) -> str:
        start = self.rng.choice(["."] + self.dirs + ["nodir"])
        expr = self.rng.choice(["", "-type f", "-type d", "-name '*.log'", "-name '*.txt' -o -name '*.csv'",
                                "-maxdepth 1", "-maxdepth 1 -type f", "-iname 'B*'", "-path '*/old/*'", "-empty",
                                "! -name '*.log' -type f", "-mindepth 2"])
        return f"find {start} {expr} | sort"

    def ls(self) -> str:
        opts = self.rng.choice(["", "-1 ", "-a ", "-A ", "-R ", "-r ", "-F ", "-d ", "-p "])
        target = self.rng.choice(["", "."] + self.dirs + ["missing"] + self.files[:2])
        return f"ls {opts}{self.q(target) if target else ''}".rstrip()

    def echo(self) -> str:
        text = " ".join(self.word() for _ in range(self.rng.randint(0, 3)))
        return self.rng.choice([f"echo {text}", f"echo -n {text}", f"echo \"{text}  x\"", f"echo -e 'a\\tb {text}'"])

    def printf(self) -> str:
        return self.rng.choice([f"printf '%s\\n' {self.word()} {self.word()}", "printf '%d-%05.1f\\n' 3 2.25",
                                f"printf '%5s|%-4s|\\n' {self.word()} ab", "printf 'no newline'"])

    def seq(self) -> str:
        return self.rng.choice(["seq 3", "seq 2 5", "seq 1 3 10", "seq -s, 4", "seq -w 8 11", "seq 5 -1 2"])

    def mutate(self) -> str:
        """A command that changes the file tree."""
        r = self.rng.randrange(9)
        f = self.file(0.15)
        if r == 0:
            return f"mkdir {self.rng.choice(['-p ', ''])}{self.rng.choice(['new', 'logs', 'new/sub', 'a.txt/x'])}"
        if r == 1:
            return f"rm {self.rng.choice(['', '-f ', '-r ', '-rf '])}{self.rng.choice([f] + self.dirs[:1] + ['nope'])}"
        if r == 2:
            return f"cp {self.rng.choice(['', '-r '])}{f} {self.rng.choice(['copy.txt', 'logs', 'new/x', f])}"
        if r == 3:
            return f"mv {f} {self.rng.choice(['moved.txt', 'data', 'nodir/x', f])}"
        if r == 4:
            return f"touch {self.rng.choice(['t.txt', f, 'nodir/t'])}"
        if r == 5:
            return f"sed -i {self.rng.choice(['s/a/A/g', '1d', 's/=.*/=X/', '/^$/d'])} {f}"
        if r == 6:
            return f"echo {self.word()} {self.rng.choice(['>', '>>'])} {self.rng.choice(['out.txt', f, 'nodir/o'])}"
        if r == 7:
            return f"rmdir {self.rng.choice(self.dirs + ['nope'])}" if self.dirs else "rmdir nope"
        # not a tree walk: real bash creates res.txt while the walk runs (a race, documented)
        return f"{self.rng.choice([self.cat, self.grep, self.sort, self.cut, self.awk])()} | {self.filt()} > res.txt; cat res.txt"

    def extra(self) -> str:
        """Quoting, globs, redirections, here-documents, variables and less common options."""
        f, g = self.file(), self.file()
        w = self.word()
        echo_glob = self.rng.choice(["*", "logs/*.log", "\\*", '"*"', "'*'", "*.{txt,log}"])
        cases = [
            f"cat {self.rng.choice(['*.txt', 'logs/*', '*/*.log', '[ab]*', '?.txt', '*.none', 'data/*.csv'])} 2>&1 | head -5",
            f"echo {echo_glob}",
            f"grep -c {w} {f} {g} 2>&1 >out.txt; cat out.txt",
            f"grep {w} {f} > out.txt 2>&1; echo $?; cat out.txt",
            f"sort {f} &> out.txt; wc -l < out.txt",
            f"cat <<EOF > notes.md\n{w} $HOME ${{HOME}}x \\$HOME\nEOF\ncat notes.md",
            f"cat <<'EOF'\n{w} $HOME\n\tTAB\nEOF",
            f"cat <<-EOF\n\tindented {w}\n\tEOF",
            f"grep -c a <<< '{w} a b'",
            f"V='{w}  two'; echo $V; echo \"$V\"; echo ${{V}}",
            f"E=; echo ${{E:-{w}}} ${{E-x}} ${{U-{w}}} ${{#w}} ${{#U}}; w={w}; echo ${{#w}} \"${{U:-a  b}}\"",
            "echo $'tab\\there' | cut -f2",
            f"printf '%s|%5.2f|%x|%c\\n' {w} 3.14159 255 {w}",
            f"printf '%d\\n' {self.rng.choice(['12', 'abc', '0x1f', '3.5', '-7'])}",
            "echo 'a\"b' \"c'd\" e\\ f",
            f"head -c {self.rng.randint(1, 30)} {f}",
            f"tail -n {self.rng.randint(0, 5)} {f} {g}",
            f"wc -w {f} {g}",
            f"cut -c {self.rng.choice(['1', '2-4', '-3', '5-'])} {f}",
            f"tr -s 'a-z' < {f}",
            f"tr -d '[:digit:]' < {f} | head -3",
            f"tr '[:upper:]' '[:lower:]' < {f} | sort -u | head -4",
            f"sed -n '{self.rng.randint(1, 4)},{self.rng.choice(['$', '+2', '~4'])}p' {f}",
            f"sed 's/[aeiou]/\\U&/g' {f}",
            f"sed -e '/^$/d' -e 's/  */ /g' {f}",
            f"sed '1!G;h;$!d' {f}",
            f"sed -n '/{w}/{{=;p}}' {f}",
            f"sed 's/{w}/[&]/2' {f}",
            f"awk '{{n += NF}} END {{print n, NR}}' {f} {g}",
            f"awk -v k={w} '$0 ~ k {{print FNR\": \"$1}}' {f}",
            f"awk '{{gsub(/[0-9]+/, \"#\"); print}}' {f}",
            f"awk '{{print substr($0, 3, 5) \"|\" length($1)}}' {f}",
            f"awk -F, '{{n = split($0, a, \",\"); print n, a[1]}}' {f}",
            f"awk 'NR == 2 {{ $1 = \"X\"; print; print NF }}' {f}",
            f"awk '{{ printf \"%-6s|%4d|%6.2f\\n\", $1, NR, NR / 3 }}' {f}",
            "awk 'BEGIN { x = 7; y = 2; print x / y, x % y, -x, x ^ y, int(-3.7) }'",
            f"awk '$1 > 50' {f}",
            f"awk 'length > 12 && !/ERROR/' {f}",
            f"awk '/a/, /e/' {f}",
            f"awk '{{ if (NF > 2) print \"big\"; else print \"small\" }}' {f}",
            f"test -s {f} && echo nonempty",
            f"[ {self.rng.randint(0, 9)} -lt {self.rng.randint(0, 9)} ] && echo lt || echo ge",
            f"[ -n \"{w}\" -a -e {f} ]; echo $?",
            f"[ {w} = {self.word()} ]; echo $?",
            f"basename {f} .txt; dirname {f}",
            f"seq {self.rng.randint(1, 5)} | tee copy.txt | wc -l; cat copy.txt",
            "mkdir -p new/a/b && touch new/a/b/f && find new | sort && rmdir new/a/b",
            f"cp {f} {g} 2>&1; ls",
            f"mv {f} renamed.txt && ls; cat renamed.txt | head -2",
            f"rm -r {self.rng.choice(self.dirs or ['x'])} && ls -R",
            f"ls -a {self.rng.choice(self.dirs or ['.'])}",
            f"cd {self.rng.choice(self.dirs or ['.'])} && ls && cd - && pwd",
            f"grep -{self.rng.choice(['o', 'w', 'x', 'ow', 'c', 'vc', 'l', 'L', 'H', 'hn'])} -e {w} -e {self.word()} {f} {g}",
            f"grep -F '{w}.' {f}; echo $?",
            f"grep -E '^[A-Za-z]+ [0-9]+$' {f}",
            f"grep '\\<{w[:3]}' {f}",
            f"sort -t, -k2,2 -k1,1r {f}",
            f"sort -n -k1,1 {f} | uniq -c",
            f"sort -u -f {f}",
            f"uniq -c {f} | sort -rn | head -3",
            f"cat -n {f} | tail -2",
            f"cat -E {f}",
            f"echo {w} | sed 's/.*/&&/'; echo \"{w}\" | wc -c",
            f"exit {self.rng.randint(0, 3)}; echo unreachable",
            f"{self.rng.choice(['sort', 'head', 'cut', 'grep', 'sed', 'uniq', 'wc', 'tr', 'ls'])} --bogus",
            f"{self.rng.choice(['sort -k', 'head -n', 'cut -f', 'grep -e', 'tail -c', 'sed -e'])}",
        ]
        return self.rng.choice(cases)

    def language(self) -> str:
        """Compound commands, substitutions, arithmetic, functions, ``read`` loops and the
        utilities added with them, built around random commands from the rest of the generator."""
        rng, f, g, w = self.rng, self.file(), self.file(), self.word()
        a, b, n = rng.randint(-20, 40), rng.randint(1, 9), rng.randint(0, 5)
        glob = rng.choice(["*", "*.txt", "logs/*", "*/*.log", "*.none", "[ab]*"])
        cond = rng.choice([f"grep -q {self.pattern()} {f}", f"[ -f {f} ]", f"[[ -n \"$(cat {f} 2>/dev/null)\" ]]",
                           f"test -d {rng.choice(self.dirs or ['x'])}", f"(( {a} > {b} ))", "false"])
        on = rng.choice(['head -n 2 "$f"', 'cat "$f" | wc -l', f'grep -c {self.pattern()} "$f"', 'echo "${f##*/}"',
                         '[ -d "$f" ] && echo dir || echo file'])
        cases = [
            f'for f in {glob}; do echo "== $f"; {on}; done',
            f"for i in $(seq {n} {n + b}); do echo $((i * {b})); done",
            f"n=0; while read -r line; do n=$((n + 1)); done < {f}; echo $n",
            f'while IFS={rng.choice([",", "=", " ", ":"])} read -r x y; do echo "[$y|$x]"; done < {f}',
            f"if {cond}; then echo yes; elif [ -e {g} ]; then echo mid; else echo no; fi",
            f"case {w} in {w[:1]}*) echo one;; *[0-9]|x*) echo two;; *) echo other;; esac",
            f'fn() {{ local x=$1; echo "$x:$#"; return {n}; }}; fn {w} "{self.word()} z"; echo $? "[$x]"',
            f'x=$({self.source()} 2>/dev/null); echo "${{#x}}"; echo "${{x%%[[:space:]]*}}" | head -c 40; echo',
            f"echo $(( {a} {rng.choice(['+', '-', '*', '/', '%', '**', '<<', '&', '^'])} {b} )) $(( {a} > {b} ? {a} : {b} ))",
            f"(( {a} > {b} )) && echo gt || echo le; x={a}; (( x += {b} )); echo $x",
            f"[[ {w} == {w[:1]}* ]] && echo m; [[ {w} =~ ^[a-z]+$ ]] && echo r; [[ -f {f} && ! -d {f} ]]; echo $?",
            f"{self.source()} 2>/dev/null | xargs {rng.choice(['', '-n 2 ', '-r '])}echo | tail -5",
            f'{self.source()} 2>/dev/null | while read -r l; do echo "> $l"; done | head -3',
            f"{{ {self.source()}; echo sep; }} 2>&1 | wc -l",
            f"(cd {rng.choice(self.dirs or ['.'])} && ls); pwd | wc -c",
            f"v={w}.tar.gz; echo ${{v%.*}} ${{v##*.}} ${{v/a/A}} ${{v//a/A}} ${{v:1:3}} ${{v^^}} ${{v#*.}}",
            f"paste -d, {f} {g}", f"paste -s {f}", f"nl {f}", f"nl -ba -w3 {f}", f"rev {f}", f"tac {f}",
            f"comm -3 <(sort {f}) <(sort {g})", f"diff -q {f} {g}; echo $?", f"diff {f} {f}; echo $?",
            f"expr {a} + {b}; expr {a} '*' {b}; expr length {w}; expr {a} '<' {b}",
            f"echo '{a} / {b}' | bc; echo 'scale=2; {a} / {b}' | bc; echo '{a}^2 + {b}' | bc",
            f"set -e; {self.source()}; echo survived", f"set -- {w} {self.word()} c; echo $#; shift; echo $@ $1",
            f"for ((i=0; i<{n}; i++)); do printf '%d,' $i; done; echo",
            f"x={a}; until [ $x -le 0 ]; do x=$((x - {b})); done; echo $x",
            "find . -name '*.txt' -exec wc -l {} \\; | sort", f"find . -type f -exec grep -l {self.pattern()} {{}} + | sort",
            f'echo "`{self.source()} 2>/dev/null | wc -l`"',
            f'while read -r x; do echo "<$x>"; done < <({self.source()} 2>/dev/null)',
            f"printf '%s\\n' {w} {self.word()} {self.word()} | xargs -n 2 echo",
            f"realpath {f} | wc -c", f"cat {f} | column -t", f"{self.source()} | sha256sum",
            "ls | xargs -I{} echo 'item: {}'",
            f"count=$(grep -c {self.pattern()} {f}); if [ \"$count\" -gt 0 ]; then echo \"$count hits\"; fi",
            f"set -o pipefail; {self.source()} | tail -1; echo $?",
        ]
        return rng.choice(cases)

    def simple(self) -> str:
        r = self.rng.random()
        if r < 0.25:
            return self.language()
        r = self.rng.random()
        if r < 0.3:
            return self.extra()
        r = self.rng.random()
        if r < 0.45:
            base = self.source()
        elif r < 0.75:
            base = f"{self.source()} | {self.filt()}"
            if self.rng.random() < 0.3:
                base += f" | {self.filt()}"
        elif r < 0.9:
            base = self.mutate()
        else:
            base = self.rng.choice([f"{self.filt()} < {self.file()}", f"cd {self.rng.choice(self.dirs + ['nodir'])} && ls",
                                    f"test -f {self.file()} && echo yes || echo no", f"[ -d {self.rng.choice(self.dirs + ['x'])} ]",
                                    "pwd", "true", "false", "unknowncmd arg", "echo $?", "X=5; echo $X ${X}y \"$X\"",
                                    f"{self.source()} 2>/dev/null | head -2", f"{self.source()} 2>&1 | {self.filt()}"])
        return base

    def command(self) -> str:
        first = self.simple()
        if self.rng.random() < 0.3:
            op = self.rng.choice([" && ", " || ", "; ", "\n"])
            return first + op + self.simple()
        return first


def random_case(rng: random.Random) -> Case:
    files, dirs = random_tree(rng)
    return Case(files, dirs, CommandGen(rng, files, dirs).command())


# ===================================================================== running both sides
def _snapshot(root: str) -> tuple[dict[str, str], set[str]]:
    files: dict[str, str] = {}
    dirs: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirnames:
            dirs.add(os.path.normpath(os.path.join(rel, d)))
        for f in filenames:
            path = os.path.normpath(os.path.join(rel, f))
            with open(os.path.join(dirpath, f), "rb") as fh:
                files[path] = fh.read().decode("utf-8", "replace")
    return files, dirs


def _sim_dirs(sh: ShellEmulator) -> set[str]:
    dirs = set(sh.fs.dirs)
    for path in list(sh.files) + list(sh.fs.dirs):
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        while parent:
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
    return {d for d in dirs if d}


_SHM = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def run_real(case: Case, timeout_s: float = 10.0) -> tuple[Outcome, str]:
    """Run in a fresh directory, on tmpfs where there is one: writing a large fixture tree to
    disk per case is slow, and a work dir outside ``/tmp`` keeps ``..`` from meaning the sim's
    private ``/tmp`` area."""
    with tempfile.TemporaryDirectory(prefix="shellagree-", dir=_SHM) as root:
        root = os.path.realpath(root)
        for d in case.dirs:
            os.makedirs(os.path.join(root, d), exist_ok=True)
        for path, text in case.files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as fh:
                fh.write(text)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": root}
        proc = subprocess.run(["bash", "-c", case.command], cwd=root, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout_s)
        files, dirs = _snapshot(root)
        return Outcome(proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"),
                       proc.returncode, files, dirs), root


def run_sim(case: Case, root: str) -> Outcome:
    files = dict(case.files)
    sh = ShellEmulator(files, root=root, env={"HOME": root})
    sh.fs.dirs.update(case.dirs)
    r = sh.run_detailed(case.command)
    return Outcome(r.stdout, r.stderr, r.exit_code, dict(files), _sim_dirs(sh))


def compare(real: Outcome, sim: Outcome, has_pipe: bool) -> list[str]:
    """The aspects that differ (empty when they agree). Commands with concurrent parts (pipelines,
    process substitutions: ``has_pipe``) compare stderr as a multiset of characters, since those
    parts in real bash interleave their error messages freely."""
    diffs = []
    if real.stdout != sim.stdout:
        diffs.append("stdout")
    if has_pipe:  # concurrent stages may even interleave inside a line: compare the characters
        if sorted(real.stderr) != sorted(sim.stderr):
            diffs.append("stderr")
    elif real.stderr != sim.stderr:
        diffs.append("stderr")
    if real.exit_code != sim.exit_code:
        diffs.append("exit_code")
    if real.files != sim.files:
        diffs.append("files")
    if real.dirs != sim.dirs:
        diffs.append("dirs")
    return diffs


def check_case(case: Case) -> tuple[list[str], Outcome, Outcome]:
    """Run one case on both sides; returns (differing aspects, real outcome, sim outcome)."""
    real, root = run_real(case)
    sim = run_sim(case, root)
    return compare(real, sim, runs_concurrently(case.command)), real, sim


def runs_concurrently(command: str) -> bool:
    """Whether bash runs parts of ``command`` at the same time: a pipeline, or a process substitution
    (``comm <(sort a) <(sort b)``: both sorts write their errors in either order)."""
    return "|" in command or "<(" in command or ">(" in command


# ===================================================================== the trajectory corpus
CONSTRUCTS: list[tuple[str, re.Pattern]] = [(name, re.compile(rx)) for name, rx in [
    ("for loop", r"(^|[;&|(\s])for\s"),
    ("while/until loop", r"(^|[;&|(\s])(while|until)\s"),
    ("if", r"(^|[;&|(\s])if\s"),
    ("case", r"(^|[;&|(\s])case\s"),
    ("function", r"\w+\s*\(\)\s*\{|(^|\s)function\s"),
    ("command substitution", r"\$\((?!\()|`"),
    ("arithmetic", r"\$\(\(|(^|[;&|\s])\(\("),
    ("[[ ]]", r"\[\["),
    ("test / [", r"(^|[;&|(!\s])(test|\[)\s"),
    ("read", r"(^|[;&|(\s])read\s"),
    ("subshell / group", r"(^|[;&|]\s*)\(\s*[^(]|(^|[;&|]\s*)\{\s"),
    ("here-document / here-string", r"<<"),
    ("pipeline", r"[^|]\|[^|]"),
    ("&& / ||", r"&&|\|\|"),
    ("redirection", r"\d?>|&>|(?<![<])<(?![<(])"),
    ("parameter expansion", r"\$\{|\$[A-Za-z_?#@*0-9]"),
    ("xargs", r"\bxargs\b"),
    ("find", r"(^|[|;&(]\s*)find\s"),
    ("grep", r"\bgrep\b"),
    ("sed", r"\bsed\b"),
    ("awk", r"\bawk\b"),
    ("ls", r"(^|[|;&(]\s*)ls\b"),
    ("cat / head / tail / nl / wc", r"(^|[|;&(]\s*)(cat|head|tail|nl|wc)\b"),
    ("file ops (cp mv rm mkdir touch)", r"(^|[|;&(]\s*)(cp|mv|rm|rmdir|mkdir|touch)\b"),
]]
"""Labels for the corpus table: a command counts under every construct it contains."""


def _without_quoted_text(command: str) -> str:
    """``command`` with the insides of quotes dropped (kept when a double-quoted string expands
    something), scanning left to right so an apostrophe inside double quotes stays text."""
    out, i = [], 0
    while i < len(command):
        c = command[i]
        if c == "\\":
            out.append(command[i:i + 2])
            i += 2
            continue
        if c in "'\"":
            j = i + 1
            while j < len(command) and command[j] != c:
                j += 2 if c == '"' and command[j] == "\\" else 1
            body = command[i + 1:j]
            out.append(c + (body if c == '"' and ("$" in body or "`" in body) else "") + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def constructs_of(command: str) -> list[str]:
    """The constructs ``command`` uses (quoted text, which only looks like code, left out)."""
    code = _without_quoted_text(command)
    return [name for name, rx in CONSTRUCTS if rx.search(code)] or ["other"]


def load_corpus(directory: str) -> tuple[dict[str, str], list[dict]]:
    """``tree.json`` (path -> text) and ``corpus.jsonl`` (one command per line, with its source)."""
    import json

    with open(os.path.join(directory, "tree.json"), encoding="utf-8") as fh:
        tree = json.load(fh)
    with open(os.path.join(directory, "corpus.jsonl"), encoding="utf-8") as fh:
        items = [json.loads(line) for line in fh if line.strip()]
    return tree, items


def corpus_case(tree: dict[str, str], command: str) -> Case:
    return Case(dict(tree), [], command)
