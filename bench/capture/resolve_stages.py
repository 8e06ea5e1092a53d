#!/usr/bin/env python3
"""Resolve a stage-definition TOML (mariadb-stages.toml) against an ELF binary.

Writes the address table read by the stgtrace Valgrind tool:
    HEXADDR STAGE FLAGS NAME
(file virtual addresses; FLAGS is '-' or 'T' for the window trigger), and a
JSON listing of the resolved functions per stage for the sidecar.

Symbols come from the binary's .dynsym (the Debian mariadbd is stripped but
exports ~21k functions).  `vtable_overrides = [{class, base}]` adds every
virtual method that `class` overrides from `base`: both vtables are read out
of .data.rel.ro through their R_X86_64_RELATIVE relocations (PIE), the
class's vtable found via its typeinfo name string (the class's symbols are
hidden).  Only the Python standard library is used.
"""
import argparse
import json
import struct
import sys
import tomllib

R_X86_64_64 = 1
R_X86_64_GLOB_DAT = 6
R_X86_64_RELATIVE = 8


class Elf:
    def __init__(self, path):
        self.data = open(path, "rb").read()
        d = self.data
        assert d[:4] == b"\x7fELF" and d[4] == 2 and d[5] == 1, "ELF64 LE only"
        (self.shoff,) = struct.unpack_from("<Q", d, 0x28)
        self.shentsize, self.shnum, self.shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        self.sections = []
        for i in range(self.shnum):
            name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
                "<IIQQQQIIQQ", d, self.shoff + i * self.shentsize)
            self.sections.append(dict(name=name, type=typ, addr=addr, off=off, size=size,
                                      link=link, entsize=entsize))
        strtab = self.sections[self.shstrndx]
        for s in self.sections:
            s["name"] = self._cstr(strtab["off"] + s["name"])
        self.by_name = {s["name"]: s for s in self.sections}
        self._dynsyms = None
        self._relocs = None

    def _cstr(self, off):
        end = self.data.index(b"\0", off)
        return self.data[off:end].decode("latin-1")

    def dynsyms(self):
        """list of (name, value, size, type) from .dynsym."""
        if self._dynsyms is None:
            ds, dstr = self.by_name[".dynsym"], self.by_name[".dynstr"]
            out = []
            for i in range(ds["size"] // 24):
                name, info, other, shndx, value, size = struct.unpack_from(
                    "<IBBHQQ", self.data, ds["off"] + i * 24)
                out.append((self._cstr(dstr["off"] + name), value, size, info & 0xF, shndx))
            self._dynsyms = out
        return self._dynsyms

    def relocs(self):
        """offset -> ('rel', addend) | ('sym', name, addend) from .rela.dyn."""
        if self._relocs is None:
            syms = self.dynsyms()
            r = self.by_name[".rela.dyn"]
            out = {}
            for i in range(r["size"] // 24):
                off, info, addend = struct.unpack_from("<QQq", self.data, r["off"] + i * 24)
                typ, sym = info & 0xFFFFFFFF, info >> 32
                if typ == R_X86_64_RELATIVE:
                    out[off] = ("rel", addend)
                elif typ in (R_X86_64_64, R_X86_64_GLOB_DAT):
                    out[off] = ("sym", syms[sym][0], addend)
            self._relocs = out
        return self._relocs

    def vaddr_to_off(self, va):
        for s in self.sections:
            if s["type"] != 8 and s["addr"] and s["addr"] <= va < s["addr"] + s["size"]:
                return s["off"] + va - s["addr"]
        return None

    def find_cstring(self, text):
        """virtual addresses of NUL-terminated occurrences of text (preceded by NUL)."""
        needle = text.encode() + b"\0"
        hits = []
        for sec in (".rodata",):
            s = self.by_name[sec]
            blob = self.data[s["off"]:s["off"] + s["size"]]
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
        raise SystemExit(f"typeinfo of {cls} not found")
    # vtable: word 0 offset-to-top (0 for the primary vtable), word 1 -> typeinfo
    cands = []
    for off, r in rel.items():
        if r[0] == "rel" and r[1] in tis:
            v = off - 8
            fo = elf.vaddr_to_off(v)
            if fo is not None and struct.unpack_from("<q", elf.data, fo)[0] == 0:
                cands.append(v)
    if len(cands) != 1:
        raise SystemExit(f"primary vtable of {cls}: {len(cands)} candidates")
    return cands[0], None


def vtable_slots(elf, vaddr, n):
    rel = elf.relocs()
    out = []
    for i in range(n):
        r = rel.get(vaddr + 16 + 8 * i)
        if r is None:
            out.append(("none",))   # no relocation: a 0 slot (pure virtual here)
        else:
            out.append(r[1] if r[0] == "rel" else ("sym", r[1]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stages")
    ap.add_argument("binary")
    ap.add_argument("--table", required=True, help="address table for stgtrace")
    ap.add_argument("--json", required=True, help="resolved stage listing")
    a = ap.parse_args()

    cfg = tomllib.load(open(a.stages, "rb"))
    elf = Elf(a.binary)
    syms = [s for s in elf.dynsyms() if s[4] != 0]   # defined
    symaddr = {}
    addrnames = {}
    symsize = {}
    for name, value, size, typ, _ in syms:
        symaddr[name] = (value, size)
        symsize[name] = size
        if typ == 2:   # STT_FUNC
            addrnames.setdefault(value, []).append(name)

    entries = {}     # addr -> (stage, flags, name)
    listing = []
    trigger = cfg.get("window_trigger")
    missing = []
    for st in cfg["stage"]:
        sid = st["id"]
        resolved = []
        for name in st.get("symbols", []):
            if name not in symaddr:
                missing.append(name)
                continue
            addr = symaddr[name][0]
            if addr in entries and entries[addr][0] != sid:
                raise SystemExit(f"{name} at {addr:#x} is in stages {entries[addr][0]} and {sid}")
            entries[addr] = (sid, "T" if name == trigger else "-", name)
            resolved.append({"symbol": name, "addr": addr})
        for vo in st.get("vtable_overrides", []):
            cls, base = vo["class"], vo["base"]
            bv, bsize = symaddr[f"_ZTV{mangled_class(base)}"]
            nslots_base = (bsize - 16) // 8
            cv, _ = class_vtable(elf, cls, symaddr)
            bslots = vtable_slots(elf, bv, nslots_base)
            cslots = vtable_slots(elf, cv, nslots_base)   # new virtuals of the class are not followed
            # slot names: the base's own functions, else those of other
            # exported subclasses of the base (e.g. ha_maria), renamed to cls
            namers = [(base, bslots)]
            for n2, (v2, s2) in symaddr.items():
                if n2.startswith("_ZTV") and n2 != f"_ZTV{mangled_class(base)}" and \
                        n2 != f"_ZTV{mangled_class(cls)}" and n2[4:].lstrip("0123456789").startswith("ha_"):
                    c2 = n2[4:].lstrip("0123456789")
                    if s2 == bsize:
                        namers.append((c2, vtable_slots(elf, v2, nslots_base)))

            def slot_name(i):
                for c2, slots in namers:
                    f2 = slots[i] if i < len(slots) else None
                    if not isinstance(f2, int):
                        continue
                    for n in addrnames.get(f2, []):
                        for pre in (f"_ZN{mangled_class(c2)}", f"_ZNK{mangled_class(c2)}"):
                            if n.startswith(pre):
                                return n[:len(pre) - len(mangled_class(c2))] + mangled_class(cls) + n[len(pre):]
                return None

            for i, fn in enumerate(cslots):
                if isinstance(fn, tuple):
                    continue   # external symbol (e.g. __cxa_pure_virtual)
                base_fn = bslots[i] if i < len(bslots) else None
                if fn == base_fn:
                    continue   # inherited, not overridden
                bname = slot_name(i)
                if bname is not None and any(x["symbol"] == bname for x in resolved):
                    bname += f" [vtable slot {i}]"   # e.g. D1/D0 destructors named alike
                if bname is None:
                    why = "pure virtual in" if isinstance(base_fn, tuple) else "unnamed slot of"
                    bname = f"{cls}::vslot{i} ({why} {base})"
                if fn in entries and entries[fn][0] != sid:
                    continue   # shared thunk / identical code folded with another stage's function
                entries[fn] = (sid, "-", bname)
                resolved.append({"symbol": bname, "addr": fn, "vtable_slot": i})
        listing.append({"id": sid, "name": st["name"], "functions": resolved})
        print(f"stage {sid:2d} {st['name']:10s} {len(resolved):4d} functions", file=sys.stderr)
    if missing:
        print("symbols not found in the binary: " + ", ".join(missing), file=sys.stderr)
    if trigger and trigger not in symaddr:
        raise SystemExit(f"window trigger {trigger} not found")
    with open(a.table, "w") as f:
        f.write(f"# stgtrace stage table for {a.binary} from {a.stages}\n")
        for addr in sorted(entries):
            sid, fl, name = entries[addr]
            f.write(f"{addr:x} {sid} {fl} {name}\n")
    with open(a.json, "w") as f:
        json.dump({"binary": a.binary, "missing": missing, "stages": listing}, f, indent=1)


if __name__ == "__main__":
    main()
