/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stgtrace: a small Valgrind tool that writes a "stagetrace v1" stream.
 *
 * Built out of tree against Debian's packaged Valgrind 3.19 (headers in
 * /usr/include/valgrind, libcoregrind/libvex in /usr/lib/x86_64-linux-gnu/
 * valgrind) by discover/stgtrace/build_tool.sh.  The structure (event collection
 * per IR statement) follows Valgrind's example tool "lackey".
 *
 * Records (little endian, 1-byte tag + packed fields):
 *   0x01 THREAD u32 tid        following records belong to Valgrind thread tid
 *   0x02 FETCH  u64 addr, u16 bytes, u16 instrs
 *   0x03 LOAD   u64 addr, u8 size
 *   0x04 STORE  u64 addr, u8 size
 *   0x05 STAGE  u16 stage      (0xFFFF = no stage)
 *   0x06 END
 *
 * FETCH granularity: a superblock is cut into "segments" at every side exit
 * (Ist_Exit), at every discontinuity of guest addresses and at every stage
 * function entry.  All instructions of a segment execute once the segment
 * is entered (the only way out of a superblock is a side exit, which ends a
 * segment), so one FETCH record per executed segment is exact.  The FETCH of
 * a segment is emitted before the segment's LOAD/STORE records.
 *
 * Stages: a table of function entry addresses (file virtual addresses of
 * the traced executable, relocated with the executable's text bias) maps a
 * function to a stage.  Each thread keeps a stack of (stage, SP at entry).
 * Entering a stage function pushes (unless it is the stage already on top);
 * an entry is popped as soon as the thread's SP rises above the SP it had at
 * the function's entry (i.e. the function returned, or the stack was unwound
 * past it by an exception / longjmp).  The current stage of a thread is the
 * stage on top of its stack (0xFFFF if empty): the innermost enclosing stage
 * function decides.
 *
 * Window: tracing is off at start.  At every entry of a function flagged
 * 'T' in the table (dispatch_command), the tool checks whether the control
 * file (--ctl-file) exists and switches tracing on/off accordingly, so the
 * traced window starts and ends exactly at a command boundary.
 * --max-instrs bounds the traced instructions: once the windows hold that
 * many, the next 'T' entry ends tracing for good (so the last window also
 * ends at a command boundary; stagevm-discover's bound on a capture).
 *
 * Independent count: every guest instruction also increments an inline IR
 * counter (like lackey's instruction counter); the counts at the switch
 * points give the window's instruction count, which must equal the sum of
 * the FETCH records' instrs.
 */

#include "pub_tool_basics.h"
#include "pub_tool_tooliface.h"
#include "pub_tool_libcassert.h"
#include "pub_tool_libcprint.h"
#include "pub_tool_libcbase.h"
#include "pub_tool_libcfile.h"
#include "pub_tool_debuginfo.h"
#include "pub_tool_mallocfree.h"
#include "pub_tool_options.h"
#include "pub_tool_machine.h"
#include "pub_tool_threadstate.h"
#include "pub_tool_vki.h"

#define TAG_THREAD 0x01
#define TAG_FETCH  0x02
#define TAG_LOAD   0x03
#define TAG_STORE  0x04
#define TAG_STAGE  0x05
#define TAG_END    0x06

#define NO_STAGE      0xFFFFu
#define UNSET_STAGE   0xFFFEu   /* internal: nothing emitted yet */

/* ------------------------------------------------------------------ */
/* options                                                             */

static const HChar *clo_out;               /* output path (FIFO into zstd) */
static const HChar *clo_stages;            /* address table */
static const HChar *clo_ctl;               /* control file */
static const HChar *clo_exe = "mariadbd";  /* basename of the executable the table refers to */
static const HChar *clo_stats;             /* key = value statistics file */
static Bool clo_trace_mem = True;
static Bool clo_start_on = False;          /* trace from the start */
static ULong clo_max_instrs;               /* 0: no bound on the traced instructions */

static Bool st_process_cmd_line_option(const HChar *arg)
{
   if      VG_STR_CLO(arg, "--out", clo_out) {}
   else if VG_STR_CLO(arg, "--stages", clo_stages) {}
   else if VG_STR_CLO(arg, "--ctl-file", clo_ctl) {}
   else if VG_STR_CLO(arg, "--exe", clo_exe) {}
   else if VG_STR_CLO(arg, "--stats-file", clo_stats) {}
   else if VG_BOOL_CLO(arg, "--trace-mem", clo_trace_mem) {}
   else if VG_BOOL_CLO(arg, "--start-on", clo_start_on) {}
   else if VG_INT_CLO(arg, "--max-instrs", clo_max_instrs) {}
   else return False;
   return True;
}

static void st_print_usage(void)
{
   VG_(printf)(
"    --out=PATH            stagetrace v1 output (raw; point it at a FIFO read by zstd)\n"
"    --stages=PATH         stage address table: lines 'HEXADDR STAGE FLAGS NAME'\n"
"    --exe=NAME            basename of the object the table's addresses refer to [mariadbd]\n"
"    --ctl-file=PATH       trace while PATH exists (checked at 'T' functions)\n"
"    --start-on=no|yes     trace from the start, ignoring --ctl-file [no]\n"
"    --trace-mem=no|yes    emit LOAD/STORE records [yes]\n"
"    --stats-file=PATH     write counters as 'key = value' lines at exit\n"
"    --max-instrs=N        stop tracing at the first 'T' entry after N traced instructions [0: never]\n");
}

static void st_print_debug_usage(void) { VG_(printf)("    (none)\n"); }

/* ------------------------------------------------------------------ */
/* output                                                              */

#define OBUF_SIZE (4u << 20)
static UChar *obuf;
static UInt   olen;
static Int    ofd = -1;
static ULong  bytes_written;

static void out_flush(void)
{
   UInt off = 0;
   while (off < olen) {
      Int n = VG_(write)(ofd, obuf + off, olen - off);
      if (n <= 0) {
         VG_(umsg)("stgtrace: write to %s failed (%d)\n", clo_out, n);
         VG_(exit)(1);
      }
      off += n;
   }
   bytes_written += olen;
   olen = 0;
}

static inline void out_reserve(UInt n) { if (olen + n > OBUF_SIZE) out_flush(); }
static inline void put8(UInt v)  { obuf[olen++] = (UChar)v; }
static inline void put16(UInt v) { obuf[olen++] = (UChar)v; obuf[olen++] = (UChar)(v >> 8); }
static inline void put32(UInt v) { put16(v & 0xFFFF); put16(v >> 16); }
static inline void put64(ULong v) { put32((UInt)v); put32((UInt)(v >> 32)); }

/* ------------------------------------------------------------------ */
/* stage table                                                         */

typedef struct {
   Addr   addr;
   UShort stage;
   UShort flags;
} StageFn;
#define FL_TRIGGER 1

static StageFn *fns;     /* sorted by file address, relocated in place once */
static UInt     n_fns;
static Bool     fns_relocated = False;
static Addr     exe_lo, exe_hi;   /* relocated address range of the table */

static ULong parse_hex(const HChar **p)
{
   ULong v = 0;
   const HChar *s = *p;
   if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
   for (;;) {
      HChar c = *s;
      if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
      else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v = v * 16 + (c - 'A' + 10);
      else break;
      s++;
   }
   *p = s;
   return v;
}

static ULong parse_dec(const HChar **p)
{
   ULong v = 0;
   const HChar *s = *p;
   while (*s >= '0' && *s <= '9') { v = v * 10 + (*s - '0'); s++; }
   *p = s;
   return v;
}

static Int cmp_fn(const void *a, const void *b)
{
   const StageFn *x = a; const StageFn *y = b;
   return x->addr < y->addr ? -1 : x->addr > y->addr ? 1 : 0;
}

static void load_stage_table(void)
{
   if (!clo_stages) return;
   SysRes sr = VG_(open)(clo_stages, VKI_O_RDONLY, 0);
   if (sr_isError(sr)) {
      VG_(umsg)("stgtrace: cannot open --stages=%s\n", clo_stages);
      VG_(exit)(1);
   }
   Int fd = sr_Res(sr);
   struct vg_stat st;
   VG_(fstat)(fd, &st);
   SizeT sz = st.size;
   HChar *txt = VG_(malloc)("stgtrace.table", sz + 1);
   SizeT got = 0;
   while (got < sz) {
      Int n = VG_(read)(fd, txt + got, sz - got);
      if (n <= 0) break;
      got += n;
   }
   txt[got] = 0;
   VG_(close)(fd);
   UInt cap = 64;
   fns = VG_(malloc)("stgtrace.fns", cap * sizeof(StageFn));
   const HChar *p = txt;
   while (*p) {
      while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
      if (!*p) break;
      if (*p == '#') { while (*p && *p != '\n') p++; continue; }
      ULong a = parse_hex(&p);
      while (*p == ' ' || *p == '\t') p++;
      ULong s = parse_dec(&p);
      while (*p == ' ' || *p == '\t') p++;
      UShort fl = 0;
      while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
         if (*p == 'T') fl |= FL_TRIGGER;
         p++;
      }
      while (*p && *p != '\n') p++;   /* name: ignored here */
      if (n_fns == cap) {
         cap *= 2;
         fns = VG_(realloc)("stgtrace.fns", fns, cap * sizeof(StageFn));
      }
      fns[n_fns].addr = (Addr)a;
      fns[n_fns].stage = (UShort)s;
      fns[n_fns].flags = fl;
      n_fns++;
   }
   VG_(free)(txt);
   VG_(ssort)(fns, n_fns, sizeof(StageFn), cmp_fn);
   VG_(umsg)("stgtrace: %u stage function entries from %s\n", n_fns, clo_stages);
}

static void try_relocate(void)
{
   if (fns_relocated || n_fns == 0) return;
   const DebugInfo *di;
   SizeT exelen = VG_(strlen)(clo_exe);
   for (di = VG_(next_DebugInfo)(NULL); di; di = VG_(next_DebugInfo)(di)) {
      const HChar *f = VG_(DebugInfo_get_filename)(di);
      if (!f) continue;
      SizeT fl = VG_(strlen)(f);
      if (fl < exelen || VG_(strcmp)(f + fl - exelen, clo_exe) != 0) continue;
      if (fl > exelen && f[fl - exelen - 1] != '/') continue;
      PtrdiffT bias = VG_(DebugInfo_get_text_bias)(di);
      UInt i;
      for (i = 0; i < n_fns; i++) fns[i].addr += bias;
      exe_lo = fns[0].addr;
      exe_hi = fns[n_fns - 1].addr;
      fns_relocated = True;
      VG_(umsg)("stgtrace: %s text bias 0x%lx, stage functions 0x%lx..0x%lx\n",
                f, (unsigned long)bias, (unsigned long)exe_lo, (unsigned long)exe_hi);
      return;
   }
}

static const StageFn *find_fn(Addr a)
{
   if (!fns_relocated || a < exe_lo || a > exe_hi) return NULL;
   UInt lo = 0, hi = n_fns;
   while (lo < hi) {
      UInt mid = (lo + hi) / 2;
      if (fns[mid].addr < a) lo = mid + 1; else hi = mid;
   }
   if (lo < n_fns && fns[lo].addr == a) return &fns[lo];
   return NULL;
}

/* ------------------------------------------------------------------ */
/* per-thread state                                                    */

#define MAX_DEPTH 256
typedef struct {
   UShort stage[MAX_DEPTH];
   Addr   sp[MAX_DEPTH];
   UInt   depth;
   UInt   emitted;        /* stage last emitted for this thread (UNSET_STAGE: none) */
   ULong  instrs;         /* traced instructions */
   Bool   seen;           /* appeared in the trace */
} ThreadSt;

static ThreadSt *threads;        /* indexed by ThreadId, VG_N_THREADS entries */
static ThreadId  last_tid = VG_INVALID_THREADID;
static Bool      tracing = False;

/* counters */
static ULong n_instr_inline;     /* every executed guest instruction (inline IR counter) */
static ULong inline_at_on, inline_window;
static ULong n_fetch, n_fetch_instrs, n_loads, n_stores, n_stage_recs, n_thread_recs;
static ULong n_windows, n_depth_overflow;
static Bool  max_reached = False;  /* --max-instrs hit: tracing stays off */
static UInt  threads_seen;

static inline UInt cur_stage(ThreadSt *t)
{
   return t->depth ? t->stage[t->depth - 1] : NO_STAGE;
}

static void reset_thread(ThreadId tid)
{
   if (tid >= VG_N_THREADS) return;
   threads[tid].depth = 0;
   threads[tid].emitted = UNSET_STAGE;
}

static void st_thread_create(ThreadId parent, ThreadId child) { reset_thread(child); }
static void st_thread_exit(ThreadId tid) { reset_thread(tid); }

static void check_ctl(void)
{
   if (clo_start_on || !clo_ctl) return;
   struct vg_stat st;
   SysRes r = VG_(stat)(clo_ctl, &st);
   Bool want = !sr_isError(r);
   if (clo_max_instrs && !max_reached) {
      ULong traced = inline_window + (tracing ? n_instr_inline - inline_at_on : 0);
      if (traced >= clo_max_instrs) {
         max_reached = True;
         VG_(umsg)("stgtrace: --max-instrs=%llu reached (%llu traced): tracing stays off\n",
                   clo_max_instrs, traced);
      }
   }
   if (max_reached) want = False;
   if (want == tracing) return;
   if (want) {
      UInt i;
      tracing = True;
      n_windows++;
      inline_at_on = n_instr_inline;
      last_tid = VG_INVALID_THREADID;
      for (i = 0; i < VG_N_THREADS; i++) threads[i].emitted = UNSET_STAGE;
      VG_(umsg)("stgtrace: tracing ON at %llu instructions\n", n_instr_inline);
   } else {
      tracing = False;
      inline_window += n_instr_inline - inline_at_on;
      out_flush();
      VG_(umsg)("stgtrace: tracing OFF at %llu instructions (window %llu)\n",
                n_instr_inline, inline_window);
   }
}

/*
 * Called at the start of every segment.
 * info: bits 0..15 bytes, 16..31 instrs, 32..47 stage+1 (0 = not a stage
 * entry), bit 48 trigger.
 */
static VG_REGPARM(3) void st_segment(Addr addr, ULong info, Addr sp)
{
   ThreadId tid = VG_(get_running_tid)();
   ThreadSt *t = &threads[tid];

   /* returns / unwinding */
   while (t->depth && sp > t->sp[t->depth - 1]) t->depth--;

   UInt stp1 = (UInt)(info >> 32) & 0xFFFF;
   if (stp1) {
      if (info & (1ULL << 48)) check_ctl();
      UShort s = (UShort)(stp1 - 1);
      if (cur_stage(t) != s) {
         if (t->depth < MAX_DEPTH) {
            t->stage[t->depth] = s;
            t->sp[t->depth] = sp;
            t->depth++;
         } else {
            n_depth_overflow++;
         }
      }
   }
   if (!tracing) return;

   if (tid != last_tid) {
      out_reserve(5);
      put8(TAG_THREAD); put32(tid);
      last_tid = tid;
      n_thread_recs++;
      if (!t->seen) { t->seen = True; threads_seen++; }
   }
   UInt cs = cur_stage(t);
   if (cs != t->emitted) {
      out_reserve(3);
      put8(TAG_STAGE); put16(cs);
      t->emitted = cs;
      n_stage_recs++;
   }
   UInt bytes = (UInt)info & 0xFFFF;
   UInt instrs = (UInt)(info >> 16) & 0xFFFF;
   out_reserve(13);
   put8(TAG_FETCH); put64(addr); put16(bytes); put16(instrs);
   n_fetch++;
   n_fetch_instrs += instrs;
   t->instrs += instrs;
}

static void emit_mem(UInt tag, Addr a, UWord size)
{
   while (size > 0) {
      UInt s = size > 64 ? 64 : (UInt)size;
      out_reserve(10);
      put8(tag); put64(a); put8(s);
      a += s; size -= s;
   }
}

static VG_REGPARM(2) void st_load(Addr a, UWord size)
{
   if (!tracing) return;
   emit_mem(TAG_LOAD, a, size);
   n_loads++;
}

static VG_REGPARM(2) void st_store(Addr a, UWord size)
{
   if (!tracing) return;
   emit_mem(TAG_STORE, a, size);
   n_stores++;
}

/* ------------------------------------------------------------------ */
/* instrumentation                                                     */

static void add_mem_call(IRSB *sb, Bool is_store, IRExpr *addr, Int size, IRExpr *guard)
{
   IRExpr **argv = mkIRExprVec_2(addr, mkIRExpr_HWord((HWord)size));
   IRDirty *di = is_store
      ? unsafeIRDirty_0_N(2, "st_store", VG_(fnptr_to_fnentry)(&st_store), argv)
      : unsafeIRDirty_0_N(2, "st_load",  VG_(fnptr_to_fnentry)(&st_load),  argv);
   if (guard) di->guard = guard;
   addStmtToIRSB(sb, IRStmt_Dirty(di));
}

static void add_inline_count(IRSB *sb)
{
   IRTemp t1 = newIRTemp(sb->tyenv, Ity_I64);
   IRTemp t2 = newIRTemp(sb->tyenv, Ity_I64);
   IRExpr *ctr = mkIRExpr_HWord((HWord)&n_instr_inline);
   addStmtToIRSB(sb, IRStmt_WrTmp(t1, IRExpr_Load(Iend_LE, Ity_I64, ctr)));
   addStmtToIRSB(sb, IRStmt_WrTmp(t2, IRExpr_Binop(Iop_Add64, IRExpr_RdTmp(t1),
                                                   IRExpr_Const(IRConst_U64(1)))));
   addStmtToIRSB(sb, IRStmt_Store(Iend_LE, ctr, IRExpr_RdTmp(t2)));
}

#define MAX_SEGS 512

static IRSB *st_instrument(VgCallbackClosure *closure, IRSB *sbIn,
                           const VexGuestLayout *layout,
                           const VexGuestExtents *vge,
                           const VexArchInfo *archinfo_host,
                           IRType gWordTy, IRType hWordTy)
{
   Int i, j;
   if (gWordTy != hWordTy) VG_(tool_panic)("host/guest word size mismatch");
   if (!fns_relocated) try_relocate();

   /* pass 1: segments.  seg_start[k] = index of the IMark starting segment k */
   static Int    seg_stmt[MAX_SEGS];
   static ULong  seg_info[MAX_SEGS];
   static Addr   seg_addr[MAX_SEGS];
   Int nseg = 0;
   Bool new_seg = True;
   Addr next_addr = 0;
   for (i = 0; i < sbIn->stmts_used; i++) {
      IRStmt *st = sbIn->stmts[i];
      if (!st) continue;
      if (st->tag == Ist_Exit) { new_seg = True; continue; }
      if (st->tag != Ist_IMark) continue;
      Addr a = (Addr)st->Ist.IMark.addr;
      UInt len = st->Ist.IMark.len;
      const StageFn *f = find_fn(a);
      if (new_seg || f || a != next_addr || nseg == 0 ||
          (seg_info[nseg - 1] & 0xFFFF) + len > 0xFFFF) {
         tl_assert(nseg < MAX_SEGS);
         seg_stmt[nseg] = i;
         seg_addr[nseg] = a;
         seg_info[nseg] = f ? ((ULong)(f->stage + 1) << 32) |
                              ((f->flags & FL_TRIGGER) ? (1ULL << 48) : 0) : 0;
         nseg++;
         new_seg = False;
      }
      seg_info[nseg - 1] += len + (1u << 16);
      next_addr = a + len;
   }

   IRSB *sbOut = deepCopyIRSBExceptStmts(sbIn);
   IRTypeEnv *tyenv = sbIn->tyenv;
   i = 0;
   while (i < sbIn->stmts_used && sbIn->stmts[i]->tag != Ist_IMark) {
      addStmtToIRSB(sbOut, sbIn->stmts[i]);
      i++;
   }
   j = 0;
   for (; i < sbIn->stmts_used; i++) {
      IRStmt *st = sbIn->stmts[i];
      if (!st || st->tag == Ist_NoOp) continue;
      switch (st->tag) {
      case Ist_IMark:
         if (j < nseg && seg_stmt[j] == i) {
            IRTemp spt = newIRTemp(sbOut->tyenv, Ity_I64);
            addStmtToIRSB(sbOut, IRStmt_WrTmp(spt, IRExpr_Get(layout->offset_SP, Ity_I64)));
            IRExpr **argv = mkIRExprVec_3(mkIRExpr_HWord((HWord)seg_addr[j]),
                                          IRExpr_Const(IRConst_U64(seg_info[j])),
                                          IRExpr_RdTmp(spt));
            IRDirty *di = unsafeIRDirty_0_N(3, "st_segment",
                                            VG_(fnptr_to_fnentry)(&st_segment), argv);
            addStmtToIRSB(sbOut, IRStmt_Dirty(di));
            j++;
         }
         addStmtToIRSB(sbOut, st);
         add_inline_count(sbOut);
         break;
      case Ist_WrTmp:
         if (clo_trace_mem && st->Ist.WrTmp.data->tag == Iex_Load) {
            IRExpr *d = st->Ist.WrTmp.data;
            add_mem_call(sbOut, False, d->Iex.Load.addr, sizeofIRType(d->Iex.Load.ty), NULL);
         }
         addStmtToIRSB(sbOut, st);
         break;
      case Ist_Store:
         if (clo_trace_mem) {
            IRType ty = typeOfIRExpr(tyenv, st->Ist.Store.data);
            add_mem_call(sbOut, True, st->Ist.Store.addr, sizeofIRType(ty), NULL);
         }
         addStmtToIRSB(sbOut, st);
         break;
      case Ist_StoreG:
         if (clo_trace_mem) {
            IRStoreG *sg = st->Ist.StoreG.details;
            IRType ty = typeOfIRExpr(tyenv, sg->data);
            add_mem_call(sbOut, True, sg->addr, sizeofIRType(ty), sg->guard);
         }
         addStmtToIRSB(sbOut, st);
         break;
      case Ist_LoadG:
         if (clo_trace_mem) {
            IRLoadG *lg = st->Ist.LoadG.details;
            IRType ty = Ity_INVALID, tyw = Ity_INVALID;
            typeOfIRLoadGOp(lg->cvt, &tyw, &ty);
            add_mem_call(sbOut, False, lg->addr, sizeofIRType(ty), lg->guard);
         }
         addStmtToIRSB(sbOut, st);
         break;
      case Ist_Dirty:
         if (clo_trace_mem) {
            IRDirty *d = st->Ist.Dirty.details;
            if (d->mFx != Ifx_None) {
               tl_assert(d->mAddr != NULL && d->mSize != 0);
               if (d->mFx == Ifx_Read || d->mFx == Ifx_Modify)
                  add_mem_call(sbOut, False, d->mAddr, d->mSize, NULL);
               if (d->mFx == Ifx_Write || d->mFx == Ifx_Modify)
                  add_mem_call(sbOut, True, d->mAddr, d->mSize, NULL);
            }
         }
         addStmtToIRSB(sbOut, st);
         break;
      case Ist_CAS:
         if (clo_trace_mem) {
            IRCAS *cas = st->Ist.CAS.details;
            Int sz = sizeofIRType(typeOfIRExpr(tyenv, cas->dataLo));
            if (cas->dataHi != NULL) sz *= 2;
            add_mem_call(sbOut, False, cas->addr, sz, NULL);
            add_mem_call(sbOut, True, cas->addr, sz, NULL);
         }
         addStmtToIRSB(sbOut, st);
         break;
      case Ist_LLSC:
         if (clo_trace_mem) {
            IRType ty;
            if (st->Ist.LLSC.storedata == NULL) {
               ty = typeOfIRTemp(tyenv, st->Ist.LLSC.result);
               add_mem_call(sbOut, False, st->Ist.LLSC.addr, sizeofIRType(ty), NULL);
            } else {
               ty = typeOfIRExpr(tyenv, st->Ist.LLSC.storedata);
               add_mem_call(sbOut, True, st->Ist.LLSC.addr, sizeofIRType(ty), NULL);
            }
         }
         addStmtToIRSB(sbOut, st);
         break;
      default:   /* Put, PutI, Exit, AbiHint, MBE */
         addStmtToIRSB(sbOut, st);
         break;
      }
   }
   tl_assert(j == nseg);
   return sbOut;
}

/* ------------------------------------------------------------------ */
/* init / fini                                                         */

static void st_post_clo_init(void)
{
   if (!clo_out) {
      VG_(umsg)("stgtrace: --out=PATH is required\n");
      VG_(exit)(1);
   }
   SysRes sr = VG_(open)(clo_out, VKI_O_WRONLY | VKI_O_CREAT | VKI_O_TRUNC, 0644);
   if (sr_isError(sr)) {
      VG_(umsg)("stgtrace: cannot open --out=%s\n", clo_out);
      VG_(exit)(1);
   }
   ofd = sr_Res(sr);
   obuf = VG_(malloc)("stgtrace.obuf", OBUF_SIZE);
   VG_(memcpy)(obuf, "STGTRC01", 8);
   olen = 8;
   threads = VG_(calloc)("stgtrace.threads", VG_N_THREADS, sizeof(ThreadSt));
   UInt i;
   for (i = 0; i < VG_N_THREADS; i++) threads[i].emitted = UNSET_STAGE;
   load_stage_table();
   if (clo_start_on) {
      tracing = True;
      n_windows = 1;
      inline_at_on = 0;
   }
}

static void st_fini(Int exitcode)
{
   if (tracing) {
      tracing = False;
      inline_window += n_instr_inline - inline_at_on;
   }
   out_reserve(1);
   put8(TAG_END);
   out_flush();
   VG_(close)(ofd);
   ULong per_thread = 0;
   UInt i;
   for (i = 0; i < VG_N_THREADS; i++) per_thread += threads[i].instrs;
   VG_(umsg)("stgtrace: total guest instructions (inline counter) %llu\n", n_instr_inline);
   VG_(umsg)("stgtrace: traced window: %llu instructions by inline counter, %llu in FETCH records (%llu records), %llu windows\n",
             inline_window, n_fetch_instrs, n_fetch, n_windows);
   VG_(umsg)("stgtrace: loads %llu stores %llu stage records %llu thread records %llu, threads %u, bytes %llu\n",
             n_loads, n_stores, n_stage_recs, n_thread_recs, threads_seen, bytes_written);
   if (n_depth_overflow)
      VG_(umsg)("stgtrace: stage stack overflows %llu\n", n_depth_overflow);
   if (clo_stats) {
      SysRes sr = VG_(open)(clo_stats, VKI_O_WRONLY | VKI_O_CREAT | VKI_O_TRUNC, 0644);
      if (!sr_isError(sr)) {
         Int fd = sr_Res(sr);
         HChar buf[2048];
         Int n = VG_(snprintf)(buf, sizeof(buf),
            "total_guest_instructions = %llu\n"
            "window_instructions_inline_counter = %llu\n"
            "window_instructions_fetch_records = %llu\n"
            "window_instructions_per_thread_sum = %llu\n"
            "fetch_records = %llu\nload_records = %llu\nstore_records = %llu\n"
            "stage_records = %llu\nthread_records = %llu\nthreads = %u\n"
            "windows = %llu\nstage_stack_overflows = %llu\nraw_bytes = %llu\n"
            "max_instrs_reached = %u\n",
            n_instr_inline, inline_window, n_fetch_instrs, per_thread,
            n_fetch, n_loads, n_stores, n_stage_recs, n_thread_recs, threads_seen,
            n_windows, n_depth_overflow, bytes_written, (UInt)max_reached);
         VG_(write)(fd, buf, n);
         VG_(close)(fd);
      }
   }
}

static void st_pre_clo_init(void)
{
   VG_(details_name)            ("stgtrace");
   VG_(details_version)         ("1");
   VG_(details_description)     ("stagevm stagetrace v1 writer");
   VG_(details_copyright_author)("stagevm contributors");
   VG_(details_bug_reports_to)  ("stagevm issue tracker");
   VG_(details_avg_translation_sizeB)(400);

   VG_(basic_tool_funcs)(st_post_clo_init, st_instrument, st_fini);
   VG_(needs_command_line_options)(st_process_cmd_line_option,
                                   st_print_usage, st_print_debug_usage);
   VG_(track_pre_thread_ll_create)(st_thread_create);
   VG_(track_pre_thread_ll_exit)(st_thread_exit);
}

VG_DETERMINE_INTERFACE_VERSION(st_pre_clo_init)
