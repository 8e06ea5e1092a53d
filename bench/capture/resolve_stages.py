#!/usr/bin/env python3
"""Resolve a stage-definition TOML (mariadb-stages.toml) against an ELF binary.

Writes the address table read by the stgtrace Valgrind tool:
    HEXADDR STAGE FLAGS NAME
(file virtual addresses; FLAGS is '-' or 'T' for the window trigger), and a
JSON listing of the resolved functions per stage for the sidecar.

Symbols come from the binary's dynamic symbol table .dynsym (the Debian
mariadbd is stripped but exports ~21k functions) and, where the binary has
one (not stripped), its static symbol table .symtab, so a program linked
without -rdynamic resolves too.  A name found in .dynsym wins; a name that
only .symtab holds at several addresses (static functions of different files)
is ambiguous and an error.

Every symbol a stage names must resolve, and so must the window trigger:
otherwise the script exits with status 1 and a one-line message naming the
missing symbols (and writes neither output), instead of producing a table in
which those stages can never be entered.

`vtable_overrides = [{class, base}]` adds every virtual method that `class`
overrides from `base`: both vtables are read out of .data.rel.ro through
their R_X86_64_RELATIVE relocations (PIE), the class's vtable found via its
typeinfo name string (the class's symbols are hidden).  Only the Python
standard library is used.
"""

import argparse
import json
import struct
import sys
import tomllib

R_X86_64_64 = 1
R_X86_64_GLOB_DAT = 6
R_X86_64_RELATIVE = 8


SHT_SYMTAB = 2
SHT_NOBITS = 8
SHT_DYNSYM = 11
STT_FUNC = 2


class Elf:
    """The parts of an ELF64 little-endian file the resolution needs."""

    def __init__(self, path):
        try:
            with open(path, "rb") as f:
                self.data = f.read()
        except OSError as e:
            raise SystemExit(f"resolve_stages.py: cannot read the binary {path}: {e.strerror}") from None
        self.path = path
        d = self.data
        if len(d) < 0x40 or d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
            raise SystemExit(f"resolve_stages.py: {path} is not an ELF64 little-endian file")
        try:
            (self.shoff,) = struct.unpack_from("<Q", d, 0x28)
            self.shentsize, self.shnum, self.shstrndx = struct.unpack_from("<HHH", d, 0x3A)
            self.sections = []
            for i in range(self.shnum):
                name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
                    "<IIQQQQIIQQ", d, self.shoff + i * self.shentsize
                )
                self.sections.append(
                    dict(name=name, type=typ, addr=addr, off=off, size=size, link=link, entsize=entsize)
                )
            strtab = self.sections[self.shstrndx]
            for s in self.sections:
                s["name"] = self._cstr(strtab["off"] + s["name"])
        except (struct.error, IndexError, ValueError):
            raise SystemExit(f"resolve_stages.py: {path}: truncated or corrupt ELF section headers") from None
        self.by_name = {s["name"]: s for s in self.sections}
        self._dynsyms = None
        self._symtab = None
        self._relocs = None

    def _cstr(self, off):
        end = self.data.index(b"\0", off)
        return self.data[off:end].decode("latin-1")

    def section(self, name):
        """The section called name; exits with a message when there is none."""
        s = self.by_name.get(name)
        if s is None:
            raise SystemExit(f"resolve_stages.py: {self.path} has no {name} section")
        return s

    def has_symtab(self):
        """Whether the binary still has its static symbol table (not stripped)."""
        return any(s["type"] == SHT_SYMTAB for s in self.sections)

    def _symbols(self, typ):
        """list of (name, value, size, type, shndx) of the symbol table of section type typ."""
        out = []
        for st in self.sections:
            if st["type"] != typ or not 0 <= st["link"] < len(self.sections):
                continue
            strs = self.sections[st["link"]]
            try:
                for i in range(st["size"] // 24):
                    name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", self.data, st["off"] + i * 24)
                    out.append((self._cstr(strs["off"] + name), value, size, info & 0xF, shndx))
            except (struct.error, ValueError):
                raise SystemExit(f"resolve_stages.py: {self.path}: corrupt {st['name']}") from None
        return out

    def dynsyms(self):
        """list of (name, value, size, type, shndx) from .dynsym (empty when there is none)."""
        if self._dynsyms is None:
            self._dynsyms = self._symbols(SHT_DYNSYM)
        return self._dynsyms

    def symtab(self):
        """list of (name, value, size, type, shndx) from .symtab (empty when stripped)."""
        if self._symtab is None:
            self._symtab = self._symbols(SHT_SYMTAB)
        return self._symtab

    def relocs(self):
        """offset -> ('rel', addend) | ('sym', name, addend) from .rela.dyn."""
        if self._relocs is None:
            syms = self.dynsyms()
            r = self.section(".rela.dyn")
            out = {}
            for i in range(r["size"] // 24):
                off, info, addend = struct.unpack_from("<QQq", self.data, r["off"] + i * 24)
                typ, sym = info & 0xFFFFFFFF, info >> 32
                if typ == R_X86_64_RELATIVE:
                    out[off] = ("rel", addend)
                elif typ in (R_X86_64_64, R_X86_64_GLOB_DAT) and sym < len(syms):
                    out[off] = ("sym", syms[sym][0], addend)
            self._relocs = out
        return self._relocs

    def vaddr_to_off(self, va):
        for s in self.sections:
            if s["type"] != SHT_NOBITS and s["addr"] and s["addr"] <= va < s["addr"] + s["size"]:
                return s["off"] + va - s["addr"]
        return None

    def find_cstring(self, text):
        """virtual addresses of NUL-terminated occurrences of text (preceded by NUL)."""
        needle = text.encode() + b"\0"
        hits = []
        for sec in (".rodata",):
            s = self.section(sec)
            blob = self.data[s["off"] : s["off"] + s["size"]]
            i = blob.find(needle)
            while i >= 0:
                if i == 0 or blob[i - 1] == 0:
                    hits.append(s["addr"] + i)
                i = blob.find(needle, i + 1)
        return hits


def mangled_class(name):
    return f"{len(name)}{name}"


def class_vtable(elf, cls, symaddr):
    """(vtable address, n slots or None) of class cls."""
    sym = f"_ZTV{mangled_class(cls)}"
    if sym in symaddr:
        return symaddr[sym]
    rel = elf.relocs()
    # typeinfo name string -> typeinfo object (2nd word points to the name)
    names = elf.find_cstring(mangled_class(cls))
    tis = [off - 8 for off, r in rel.items() if r[0] == "rel" and r[1] in names]
    if not tis:
        raise SystemExit(f"resolve_stages.py: typeinfo of {cls} not found")
    # vtable: word 0 offset-to-top (0 for the primary vtable), word 1 -> typeinfo
    cands = []
    for off, r in rel.items():
        if r[0] == "rel" and r[1] in tis:
            v = off - 8
            fo = elf.vaddr_to_off(v)
            if fo is not None and struct.unpack_from("<q", elf.data, fo)[0] == 0:
                cands.append(v)
    if len(cands) != 1:
        raise SystemExit(f"resolve_stages.py: primary vtable of {cls}: {len(cands)} candidates")
    return cands[0], None


def vtable_slots(elf, vaddr, n):
    rel = elf.relocs()
    out = []
    for i in range(n):
        r = rel.get(vaddr + 16 + 8 * i)
        if r is None:
            out.append(("none",))  # no relocation: a 0 slot (pure virtual here)
        else:
            out.append(r[1] if r[0] == "rel" else ("sym", r[1]))
    return out


def load_stage_map(path):
    """The stage map TOML at path, checked for the keys the resolution reads."""
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except OSError as e:
        raise SystemExit(f"resolve_stages.py: cannot read the stage map {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"resolve_stages.py: stage map {path}: {e}") from None

    def bad(what):
        raise SystemExit(f"resolve_stages.py: stage map {path}: {what}")

    stages = cfg.get("stage")
    if not isinstance(stages, list) or not stages:
        bad("no [[stage]] tables")
    for i, st in enumerate(stages):
        if not isinstance(st, dict):
            bad(f"stage #{i + 1} is not a table")
        sid = st.get("id")
        if not isinstance(sid, int) or isinstance(sid, bool) or not 0 <= sid < 0xFFFF:
            bad(f"stage #{i + 1}: `id` must be an integer 0..65534 (65535 means no stage)")
        if not isinstance(st.get("name"), str):
            bad(f"stage {sid}: `name` must be a string")
        syms = st.get("symbols", [])
        if not isinstance(syms, list) or not all(isinstance(x, str) and x for x in syms):
            bad(f"stage {sid}: `symbols` must be a list of non-empty strings")
        vos = st.get("vtable_overrides", [])
        if not isinstance(vos, list) or not all(
            isinstance(v, dict) and isinstance(v.get("class"), str) and isinstance(v.get("base"), str) for v in vos
        ):
            bad(f'stage {sid}: `vtable_overrides` must be a list of {{ class = "...", base = "..." }}')
    if not isinstance(cfg.get("window_trigger", ""), str):
        bad("`window_trigger` must be a string")
    return cfg


def symbol_tables(elf):
    """The binary's defined symbols: (symaddr, source, addrnames, ambiguous).

    symaddr: name -> (value, size); source: name -> ".dynsym" | ".symtab";
    addrnames: function address -> names; ambiguous: name -> sorted addresses
    of a name that only .symtab holds, at more than one address (e.g. static
    functions of the same name in different files).  .dynsym wins over
    .symtab; within .dynsym the last entry of a name wins (as before).
    """
    symaddr, source, addrnames = {}, {}, {}
    for name, value, size, typ, shndx in elf.dynsyms():
        if shndx == 0 or not name:  # undefined (imported) or the null symbol
            continue
        symaddr[name] = (value, size)
        source[name] = ".dynsym"
        if typ == STT_FUNC:
            addrnames.setdefault(value, []).append(name)
    static = {}
    for name, value, size, typ, shndx in elf.symtab():
        if shndx == 0 or not name or name in source or typ in (3, 4):  # STT_SECTION, STT_FILE
            continue
        static.setdefault(name, {})[value] = (size, typ)
    ambiguous = {}
    for name, at in static.items():
        if len(at) > 1:
            ambiguous[name] = sorted(at)
            continue
        ((value, (size, typ)),) = at.items()
        symaddr[name] = (value, size)
        source[name] = ".symtab"
        if typ == STT_FUNC:
            addrnames.setdefault(value, []).append(name)
    return symaddr, source, addrnames, ambiguous


def unresolved_message(elf, cfg, symaddr, ambiguous):
    """One line naming every stage symbol (and the window trigger) that does
    not resolve, with a hint; None when all resolve."""
    missing, amb = [], []
    for st in cfg["stage"]:
        for name in st.get("symbols", []):
            if name in ambiguous:
                amb.append(f"{name} (stage {st['name']}: at " + ", ".join(f"{x:#x}" for x in ambiguous[name]) + ")")
            elif name not in symaddr:
                missing.append(f"{name} (stage {st['name']})")
    trigger = cfg.get("window_trigger")
    if trigger and trigger not in symaddr:
        missing.append(f"{trigger} (window_trigger)")
    if not missing and not amb:
        return None
    if elf.has_symtab():
        searched = ".dynsym and .symtab searched"
        hint = (
            "hint: no symbol of that name is in the dynamic (.dynsym) or the static symbol table "
            "(.symtab): check the mangled name with `nm -D` / `nm`; an inlined or renamed function "
            "has none (a stripped build of the program needs -rdynamic)"
        )
    else:
        searched = ".dynsym searched; the binary has no .symtab (stripped)"
        hint = (
            "hint: link the program with -rdynamic so the functions are exported in .dynsym, "
            "or do not strip it (a symbol that is only in the static symbol table .symtab "
            "is read from there)"
        )
    parts = []
    if missing:
        parts.append(f"{len(missing)} stage symbol(s) not found in {elf.path} ({searched}): " + ", ".join(missing))
    if amb:
        parts.append(
            f"{len(amb)} stage symbol(s) ambiguous in {elf.path}'s .symtab "
            "(several static functions of that name; give the intended one a unique, "
            "exported name): " + ", ".join(amb)
        )
    if missing:
        parts.append(hint)
    return "resolve_stages.py: " + "; ".join(parts)


def main():
    """Resolves the stage map against the binary and writes the table and the listing."""
    ap = argparse.ArgumentParser()
    ap.add_argument("stages")
    ap.add_argument("binary")
    ap.add_argument("--table", required=True, help="address table for stgtrace")
    ap.add_argument("--json", required=True, help="resolved stage listing")
    a = ap.parse_args()

    cfg = load_stage_map(a.stages)
    elf = Elf(a.binary)
    symaddr, source, addrnames, ambiguous = symbol_tables(elf)
    msg = unresolved_message(elf, cfg, symaddr, ambiguous)
    if msg:
        raise SystemExit(msg)

    entries = {}  # addr -> (stage, flags, name)
    listing = []
    trigger = cfg.get("window_trigger")
    missing = []  # kept in the JSON for its readers; always empty now
    from_symtab = 0
    for st in cfg["stage"]:
        sid = st["id"]
        resolved = []
        for name in st.get("symbols", []):
            addr = symaddr[name][0]
            if addr in entries and entries[addr][0] != sid:
                raise SystemExit(f"resolve_stages.py: {name} at {addr:#x} is in stages {entries[addr][0]} and {sid}")
            entries[addr] = (sid, "T" if name == trigger else "-", name)
            resolved.append({"symbol": name, "addr": addr, "table": source[name]})
            from_symtab += source[name] == ".symtab"
        for vo in st.get("vtable_overrides", []):
            cls, base = vo["class"], vo["base"]
            if f"_ZTV{mangled_class(base)}" not in symaddr:
                raise SystemExit(
                    f"resolve_stages.py: stage {st['name']}: vtable_overrides base class {base}: "
                    f"its vtable _ZTV{mangled_class(base)} is not in {a.binary}'s symbols"
                )
            bv, bsize = symaddr[f"_ZTV{mangled_class(base)}"]
            nslots_base = (bsize - 16) // 8
            cv, _ = class_vtable(elf, cls, symaddr)
            bslots = vtable_slots(elf, bv, nslots_base)
            cslots = vtable_slots(elf, cv, nslots_base)  # new virtuals of the class are not followed
            # slot names: the base's own functions, else those of other
            # exported subclasses of the base (e.g. ha_maria), renamed to cls
            namers = [(base, bslots)]
            for n2, (v2, s2) in symaddr.items():
                if (
                    n2.startswith("_ZTV")
                    and n2 != f"_ZTV{mangled_class(base)}"
                    and n2 != f"_ZTV{mangled_class(cls)}"
                    and n2[4:].lstrip("0123456789").startswith("ha_")
                ):
                    c2 = n2[4:].lstrip("0123456789")
                    if s2 == bsize:
                        namers.append((c2, vtable_slots(elf, v2, nslots_base)))

            # Called within this iteration only: binds this class's namers.
            def slot_name(i, namers=namers, cls=cls):
                for c2, slots in namers:
                    f2 = slots[i] if i < len(slots) else None
                    if not isinstance(f2, int):
                        continue
                    for n in addrnames.get(f2, []):
                        for pre in (f"_ZN{mangled_class(c2)}", f"_ZNK{mangled_class(c2)}"):
                            if n.startswith(pre):
                                return n[: len(pre) - len(mangled_class(c2))] + mangled_class(cls) + n[len(pre) :]
                return None

            for i, fn in enumerate(cslots):
                if isinstance(fn, tuple):
                    continue  # external symbol (e.g. __cxa_pure_virtual)
                base_fn = bslots[i] if i < len(bslots) else None
                if fn == base_fn:
                    continue  # inherited, not overridden
                bname = slot_name(i)
                if bname is not None and any(x["symbol"] == bname for x in resolved):
                    bname += f" [vtable slot {i}]"  # e.g. D1/D0 destructors named alike
                if bname is None:
                    why = "pure virtual in" if isinstance(base_fn, tuple) else "unnamed slot of"
                    bname = f"{cls}::vslot{i} ({why} {base})"
                if fn in entries and entries[fn][0] != sid:
                    continue  # shared thunk / identical code folded with another stage's function
                entries[fn] = (sid, "-", bname)
                resolved.append({"symbol": bname, "addr": fn, "vtable_slot": i})
        listing.append({"id": sid, "name": st["name"], "functions": resolved})
        print(f"stage {sid:2d} {st['name']:10s} {len(resolved):4d} functions", file=sys.stderr)
    if from_symtab:
        print(f"{from_symtab} stage symbol(s) resolved from .symtab (not exported in .dynsym)", file=sys.stderr)
    with open(a.table, "w") as f:
        f.write(f"# stgtrace stage table for {a.binary} from {a.stages}\n")
        for addr in sorted(entries):
            sid, fl, name = entries[addr]
            f.write(f"{addr:x} {sid} {fl} {name}\n")
    with open(a.json, "w") as f:
        json.dump({"binary": a.binary, "missing": missing, "stages": listing}, f, indent=1)


if __name__ == "__main__":
    main()
