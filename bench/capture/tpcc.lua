#!/usr/bin/env sysbench
-- TPC-C for sysbench 1.0 (MySQL/MariaDB driver), written for bench/capture
-- from the public TPC-C specification (revision 5.11): the schema of clause
-- 1.3, the initial population of clause 4.3, the five transaction profiles of
-- clause 2 and the mix of clause 5.2.3.  Not a TPC-C implementation in the
-- benchmark sense (no terminals, keying/think times, or response-time rules):
-- it is the transactions' SQL, driven as fast as sysbench goes.
--
--   sysbench tpcc.lua --warehouses=2 --threads=2 [mysql options] prepare
--   sysbench tpcc.lua --warehouses=2 --threads=16 --events=N --db-ps-mode=disable run
--        (capture.sh: --events=176 --thread-events=10 --rand-seed=1: 10 per connection)
--   sysbench tpcc.lua analyze      (ANALYZE TABLE of all nine, after prepare)
--   sysbench tpcc.lua cleanup
--
-- Every transaction is BEGIN ... COMMIT (or ROLLBACK) with its statements sent
-- as text.  The statement counts are shaped so that the type of a transaction
-- can be told from the number of table statements between BEGIN and
-- COMMIT/ROLLBACK alone (bench/capture/tpcc_mix.py counts them in a trace):
--
--   Stock-Level   2           Order-Status   3
--   New-Order     7 + 2*ol_cnt = 17..37 (odd), 6 when rolled back (1 %)
--   Payment       7           Delivery       10 + 6*(districts delivered) = 70
--
-- (Delivery: 7 statements per district, 1 for a district without an
-- undelivered order; 10 + 6k is even, New-Order is odd, so they never meet.)
-- A transaction that hits a deadlock / lock-wait timeout is rolled back and
-- retried with the same input; the failed attempt is followed by ROLLBACK and
-- an extra "DO 0" so it can be recognised (three statements without a table
-- between two transactions instead of two).
--
-- At the end every thread prints one line
--   tpcc-mix: thread=T new_order=.. new_order_rollback=.. payment=.. ...
-- which bench/capture/tpcc_mix.py sums (the script's own mix).

sysbench.cmdline.options = {
   warehouses = {"Number of warehouses (W)", 2},
   load_batch = {"Rows per multi-row INSERT when loading", 500},
   mix = {"Transaction mix in percent: New-Order,Payment,Order-Status,Delivery,Stock-Level " ..
          "(clause 5.2.3 minimums: Payment >= 43, the three others >= 4 each)", "45,43,4,4,4"},
   thread_events = {"Transactions per thread: each thread stops after this many (0 = no limit; " ..
                    "then --events/--time decide). Makes the mix and each thread's work independent " ..
                    "of scheduling; give --events >= threads * (thread_events + 1)", 0},
   mysql_storage_engine = {"Storage engine", "innodb"},
}

local W                  -- number of warehouses
local DIST_PER_WARE = 10     -- clause 4.3.3.1
local CUST_PER_DIST = 3000
local ORD_PER_DIST = 3000
local MAXITEMS = 100000
local FIRST_UNDELIVERED = 2101 -- orders 2101..3000 are in NEW-ORDER (900 per district)

-- NURand constants C (clause 2.1.6): C for C_LAST differs between load and
-- run by 65..119, not 96 or 112 (clause 2.1.6.1); fixed here for reproducibility.
local C_LAST_LOAD, C_LAST_RUN, C_ID, C_OL_I_ID = 157, 223, 259, 7911

local drv, con

-- Random numbers: a generator per thread, seeded from --rand-seed and the
-- thread number (sysbench's own per-thread generators are seeded in thread
-- start-up order, which varies between runs).  Lehmer / MINSTD
-- (x = 48271 x mod 2^31-1), exact in LuaJIT's doubles; plenty for drawing
-- keys and amounts.
local rng = 1
local function seed_rng(thread)
   rng = ((sysbench.opt.rand_seed or 0) * 7919 + thread * 104729 + 12345) % 2147483646 + 1
   for _ = 1, 10 do rng = (rng * 48271) % 2147483647 end
end
local function rand(a, b)                  -- uniform integer in [a, b]
   rng = (rng * 48271) % 2147483647
   return a + math.floor((rng - 1) / 2147483646 * (b - a + 1))
end

local function NURand(A, x, y, C)          -- clause 2.1.6
   return (((bit.bor(rand(0, A), rand(x, y))) + C) % (y - x + 1)) + x
end

-- random strings (clause 4.3.2.2): substrings of a per-thread pool of random
-- characters, which keeps loading fast; only [0-9A-Za-z] so no quoting needed
local ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
local apool, npool
local function make_pools()
   local a, n = {}, {}
   for i = 1, 8192 do
      local k = rand(1, #ALNUM)
      a[i] = ALNUM:sub(k, k)
      n[i] = tostring(rand(0, 9))
   end
   apool, npool = table.concat(a), table.concat(n)
end
local function astring(lo, hi)
   local len = rand(lo, hi)
   local off = rand(1, #apool - len)
   return apool:sub(off, off + len - 1)
end
local function nstring(lo, hi)
   local len = rand(lo, hi)
   local off = rand(1, #npool - len)
   return npool:sub(off, off + len - 1)
end
-- i_data / s_data: 10 % contain "ORIGINAL" at a random position (4.3.3.1)
local function data_string()
   local s = astring(26, 50)
   if rand(1, 10) == 1 then
      local p = rand(1, #s - 8)
      s = s:sub(1, p - 1) .. "ORIGINAL" .. s:sub(p + 8)
   end
   return s
end
local function zip() return nstring(4, 4) .. "11111" end   -- 4.3.2.7
local function state() return astring(2, 2) end

-- C_LAST from a number 0..999 (clause 4.3.2.3)
local SYL = {"BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"}
local function lastname(num)
   return SYL[math.floor(num / 100) + 1] .. SYL[math.floor(num / 10) % 10 + 1] .. SYL[num % 10 + 1]
end

local function q(s) return "'" .. s .. "'" end

-- ---------------------------------------------------------------- schema (1.3)

local SCHEMA = {
   warehouse = [[
      w_id SMALLINT NOT NULL, w_name VARCHAR(10), w_street_1 VARCHAR(20), w_street_2 VARCHAR(20),
      w_city VARCHAR(20), w_state CHAR(2), w_zip CHAR(9), w_tax DECIMAL(4,4), w_ytd DECIMAL(12,2),
      PRIMARY KEY (w_id)]],
   district = [[
      d_id TINYINT NOT NULL, d_w_id SMALLINT NOT NULL, d_name VARCHAR(10), d_street_1 VARCHAR(20),
      d_street_2 VARCHAR(20), d_city VARCHAR(20), d_state CHAR(2), d_zip CHAR(9), d_tax DECIMAL(4,4),
      d_ytd DECIMAL(12,2), d_next_o_id INT, PRIMARY KEY (d_w_id, d_id)]],
   customer = [[
      c_id INT NOT NULL, c_d_id TINYINT NOT NULL, c_w_id SMALLINT NOT NULL, c_first VARCHAR(16),
      c_middle CHAR(2), c_last VARCHAR(16), c_street_1 VARCHAR(20), c_street_2 VARCHAR(20),
      c_city VARCHAR(20), c_state CHAR(2), c_zip CHAR(9), c_phone CHAR(16), c_since DATETIME,
      c_credit CHAR(2), c_credit_lim DECIMAL(12,2), c_discount DECIMAL(4,4), c_balance DECIMAL(12,2),
      c_ytd_payment DECIMAL(12,2), c_payment_cnt SMALLINT, c_delivery_cnt SMALLINT,
      c_data VARCHAR(500), PRIMARY KEY (c_w_id, c_d_id, c_id),
      KEY idx_customer_name (c_w_id, c_d_id, c_last, c_first)]],
   -- HISTORY has no primary key in the specification (InnoDB adds a hidden one)
   history = [[
      h_c_id INT, h_c_d_id TINYINT, h_c_w_id SMALLINT, h_d_id TINYINT, h_w_id SMALLINT,
      h_date DATETIME, h_amount DECIMAL(6,2), h_data VARCHAR(24)]],
   new_orders = [[
      no_o_id INT NOT NULL, no_d_id TINYINT NOT NULL, no_w_id SMALLINT NOT NULL,
      PRIMARY KEY (no_w_id, no_d_id, no_o_id)]],
   orders = [[
      o_id INT NOT NULL, o_d_id TINYINT NOT NULL, o_w_id SMALLINT NOT NULL, o_c_id INT,
      o_entry_d DATETIME, o_carrier_id TINYINT, o_ol_cnt TINYINT, o_all_local TINYINT,
      PRIMARY KEY (o_w_id, o_d_id, o_id), KEY idx_orders_customer (o_w_id, o_d_id, o_c_id, o_id)]],
   order_line = [[
      ol_o_id INT NOT NULL, ol_d_id TINYINT NOT NULL, ol_w_id SMALLINT NOT NULL,
      ol_number TINYINT NOT NULL, ol_i_id INT, ol_supply_w_id SMALLINT, ol_delivery_d DATETIME,
      ol_quantity TINYINT, ol_amount DECIMAL(6,2), ol_dist_info CHAR(24),
      PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)]],
   item = [[
      i_id INT NOT NULL, i_im_id INT, i_name VARCHAR(24), i_price DECIMAL(5,2), i_data VARCHAR(50),
      PRIMARY KEY (i_id)]],
   stock = [[
      s_i_id INT NOT NULL, s_w_id SMALLINT NOT NULL, s_quantity SMALLINT,
      s_dist_01 CHAR(24), s_dist_02 CHAR(24), s_dist_03 CHAR(24), s_dist_04 CHAR(24),
      s_dist_05 CHAR(24), s_dist_06 CHAR(24), s_dist_07 CHAR(24), s_dist_08 CHAR(24),
      s_dist_09 CHAR(24), s_dist_10 CHAR(24), s_ytd DECIMAL(8,0), s_order_cnt SMALLINT,
      s_remote_cnt SMALLINT, s_data VARCHAR(50), PRIMARY KEY (s_w_id, s_i_id)]],
}
local TABLES = {"warehouse", "district", "customer", "history", "new_orders", "orders",
                "order_line", "item", "stock"}

-- ---------------------------------------------------------------- loading (4.3)

-- multi-row INSERT in batches of --load-batch rows, 50 batches per transaction
local Loader = {}
Loader.__index = Loader
local function loader(tbl)
   return setmetatable({tbl = tbl, rows = {}, n = 0}, Loader)
end
function Loader:add(row)
   self.n = self.n + 1
   self.rows[self.n] = "(" .. row .. ")"
   if self.n >= sysbench.opt.load_batch then self:flush() end
end
function Loader:flush()
   if self.n > 0 then
      con:query("INSERT INTO " .. self.tbl .. " VALUES " .. table.concat(self.rows, ",", 1, self.n))
      self.rows, self.n = {}, 0
   end
end

local function load_items()
   local l = loader("item")
   for i = 1, MAXITEMS do
      l:add(string.format("%d,%d,'%s',%d.%02d,'%s'", i, rand(1, 10000), astring(14, 24),
                          rand(1, 100), rand(0, 99), data_string()))
   end
   l:flush()
end

local function load_warehouse(w)
   con:query(string.format("INSERT INTO warehouse VALUES (%d,'%s','%s','%s','%s','%s','%s',0.%04d,300000.00)",
                           w, astring(6, 10), astring(10, 20), astring(10, 20), astring(10, 20),
                           state(), zip(), rand(0, 2000)))
   -- STOCK: 100 000 rows per warehouse
   local l = loader("stock")
   for i = 1, MAXITEMS do
      local d = {}
      for k = 1, 10 do d[k] = q(astring(24, 24)) end
      l:add(string.format("%d,%d,%d,%s,0,0,0,'%s'", i, w, rand(10, 100), table.concat(d, ","),
                          data_string()))
   end
   l:flush()
   for d = 1, DIST_PER_WARE do
      con:query(string.format("INSERT INTO district VALUES (%d,%d,'%s','%s','%s','%s','%s','%s',0.%04d,30000.00,%d)",
                              d, w, astring(6, 10), astring(10, 20), astring(10, 20), astring(10, 20),
                              state(), zip(), rand(0, 2000), ORD_PER_DIST + 1))
      -- CUSTOMER (3000) and one HISTORY row each
      local lc, lh = loader("customer"), loader("history")
      for c = 1, CUST_PER_DIST do
         local last = lastname(c <= 1000 and c - 1 or NURand(255, 0, 999, C_LAST_LOAD))
         lc:add(string.format("%d,%d,%d,'%s','OE','%s','%s','%s','%s','%s','%s','%s',NOW(),'%s',"
                              .. "50000.00,0.%04d,-10.00,10.00,1,0,'%s'",
                              c, d, w, astring(8, 16), last, astring(10, 20), astring(10, 20),
                              astring(10, 20), state(), zip(), nstring(16, 16),
                              rand(1, 10) == 1 and "BC" or "GC", rand(0, 5000), astring(300, 500)))
         lh:add(string.format("%d,%d,%d,%d,%d,NOW(),10.00,'%s'", c, d, w, d, w, astring(12, 24)))
      end
      lc:flush(); lh:flush()
      -- ORDERS (3000, customers in a random permutation), ORDER-LINE, NEW-ORDER
      local perm = {}
      for i = 1, CUST_PER_DIST do perm[i] = i end
      for i = CUST_PER_DIST, 2, -1 do
         local j = rand(1, i)
         perm[i], perm[j] = perm[j], perm[i]
      end
      local lo, lol, lno = loader("orders"), loader("order_line"), loader("new_orders")
      for o = 1, ORD_PER_DIST do
         local ol_cnt = rand(5, 15)
         local delivered = o < FIRST_UNDELIVERED
         lo:add(string.format("%d,%d,%d,%d,NOW(),%s,%d,1", o, d, w, perm[o],
                              delivered and tostring(rand(1, 10)) or "NULL", ol_cnt))
         for n = 1, ol_cnt do
            lol:add(string.format("%d,%d,%d,%d,%d,%d,%s,5,%s,'%s'", o, d, w, n, rand(1, MAXITEMS), w,
                                  delivered and "NOW()" or "NULL",
                                  delivered and "0.00" or string.format("%d.%02d", rand(0, 9999), rand(1, 99)),
                                  astring(24, 24)))
         end
         if not delivered then lno:add(string.format("%d,%d,%d", o, d, w)) end
      end
      lo:flush(); lol:flush(); lno:flush()
   end
end

function cmd_prepare()
   W = sysbench.opt.warehouses
   drv = sysbench.sql.driver()
   con = drv:connect()
   seed_rng(1000 + sysbench.tid)
   make_pools()
   local tid, nthreads = sysbench.tid % sysbench.opt.threads, sysbench.opt.threads
   for _, t in ipairs(TABLES) do
      con:query("CREATE TABLE IF NOT EXISTS " .. t .. " (" .. SCHEMA[t] .. ") ENGINE = "
                   .. sysbench.opt.mysql_storage_engine)
   end
   if tid == 0 then
      print("tpcc: loading ITEM (" .. MAXITEMS .. " rows)")
      load_items()
   end
   for w = tid + 1, W, nthreads do
      print(string.format("tpcc: thread %d loading warehouse %d", tid, w))
      load_warehouse(w)
   end
   con:disconnect()
end

-- fresh InnoDB statistics, so the optimizer sees the loaded cardinalities
-- (without them it may scan STOCK for Stock-Level's join)
function cmd_analyze()
   drv = sysbench.sql.driver()
   con = drv:connect()
   con:query("ANALYZE TABLE " .. table.concat(TABLES, ", "))
end

function cmd_cleanup()
   drv = sysbench.sql.driver()
   con = drv:connect()
   for _, t in ipairs(TABLES) do con:query("DROP TABLE IF EXISTS " .. t) end
end

sysbench.cmdline.commands = {
   prepare = {cmd_prepare, sysbench.cmdline.PARALLEL_COMMAND},
   analyze = {cmd_analyze},
   cleanup = {cmd_cleanup},
}

-- ---------------------------------------------------------------- transactions (clause 2)

local tid, home_w, stock_d     -- the thread's "terminal": home warehouse, Stock-Level district
local counts = {}              -- what this thread ran (printed by thread_done)
local function count(k, n) counts[k] = (counts[k] or 0) + (n or 1) end
local nstmt                    -- table statements of the current attempt

local function query(sql)
   nstmt = nstmt + 1
   return con:query(sql)
end
local function query_row(sql)  -- first row (table of strings) or nil
   nstmt = nstmt + 1
   local rs = con:query(sql)
   if rs == nil or rs.nrows == 0 then return nil end
   return rs:fetch_row()
end

local function other_warehouse(w)   -- a uniformly chosen warehouse other than w (W > 1)
   local o = rand(1, W - 1)
   return o >= w and o + 1 or o
end

-- New-Order, clause 2.4.  Input per 2.4.1; items drawn distinct and sorted
-- by (supply warehouse, item) so concurrent New-Orders lock stock rows in one
-- order.  Statements: 1 customer+warehouse, 2 district FOR UPDATE, 3 district
-- update, 4 ORDERS, 5 NEW-ORDER, 6 the items (one SELECT ... IN), then 2 per
-- line (stock FOR UPDATE, stock update) and one multi-row ORDER-LINE insert.
local function gen_new_order()
   local p = {w = home_w, d = rand(1, DIST_PER_WARE), c = NURand(1023, 1, CUST_PER_DIST, C_ID),
              ol_cnt = rand(5, 15), rbk = rand(1, 100), lines = {}}
   local seen = {}
   local all_local = 1
   for n = 1, p.ol_cnt do
      local i
      repeat i = NURand(8191, 1, MAXITEMS, C_OL_I_ID) until not seen[i]
      seen[i] = true
      local sw = p.w
      if W > 1 and rand(1, 100) == 1 then sw = other_warehouse(p.w); all_local = 0 end  -- 1 % remote
      p.lines[n] = {i = i, sw = sw, qty = rand(1, 10)}
   end
   -- 1 % roll back: the last item is an unused id (2.4.1.4)
   if p.rbk == 1 then p.lines[p.ol_cnt].i = MAXITEMS + 1 end
   table.sort(p.lines, function(a, b) return a.sw < b.sw or (a.sw == b.sw and a.i < b.i) end)
   p.all_local = all_local
   return p
end

local function new_order(p)
   local w, d, c = p.w, p.d, p.c
   query_row(string.format("SELECT c_discount, c_last, c_credit, w_tax FROM customer, warehouse "
                              .. "WHERE w_id = %d AND c_w_id = w_id AND c_d_id = %d AND c_id = %d", w, d, c))
   local r = query_row(string.format("SELECT d_next_o_id, d_tax FROM district WHERE d_w_id = %d AND d_id = %d "
                                        .. "FOR UPDATE", w, d))
   local o_id = tonumber(r[1])
   query(string.format("UPDATE district SET d_next_o_id = %d WHERE d_w_id = %d AND d_id = %d", o_id + 1, w, d))
   query(string.format("INSERT INTO orders (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_carrier_id, o_ol_cnt, "
                          .. "o_all_local) VALUES (%d, %d, %d, %d, NOW(), NULL, %d, %d)",
                       o_id, d, w, c, p.ol_cnt, p.all_local))
   query(string.format("INSERT INTO new_orders (no_o_id, no_d_id, no_w_id) VALUES (%d, %d, %d)", o_id, d, w))
   local ids = {}
   for n, l in ipairs(p.lines) do ids[n] = l.i end
   local rs = query("SELECT i_id, i_price, i_name, i_data FROM item WHERE i_id IN (" .. table.concat(ids, ",") .. ")")
   local price = {}
   for _ = 1, rs.nrows do
      local row = rs:fetch_row()
      price[tonumber(row[1])] = tonumber(row[2])
   end
   if rs.nrows < p.ol_cnt then         -- an item was not found: "Item number is not valid"
      assert(p.rbk == 1, "New-Order: item missing without the rollback flag")
      return "rollback"
   end
   local vals = {}
   for n, l in ipairs(p.lines) do
      local s = query_row(string.format("SELECT s_quantity, s_data, s_dist_%02d FROM stock WHERE s_i_id = %d "
                                           .. "AND s_w_id = %d FOR UPDATE", d, l.i, l.sw))
      local sq = tonumber(s[1])
      sq = (sq - l.qty >= 10) and (sq - l.qty) or (sq - l.qty + 91)            -- 2.4.2.2
      query(string.format("UPDATE stock SET s_quantity = %d, s_ytd = s_ytd + %d, s_order_cnt = s_order_cnt + 1, "
                             .. "s_remote_cnt = s_remote_cnt + %d WHERE s_i_id = %d AND s_w_id = %d",
                          sq, l.qty, l.sw ~= w and 1 or 0, l.i, l.sw))
      vals[n] = string.format("(%d, %d, %d, %d, %d, %d, NULL, %d, %.2f, '%s')", o_id, d, w, n, l.i, l.sw,
                              l.qty, l.qty * price[l.i], s[3])
   end
   query("INSERT INTO order_line (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id, ol_supply_w_id, ol_delivery_d, "
            .. "ol_quantity, ol_amount, ol_dist_info) VALUES " .. table.concat(vals, ", "))
   return "commit"
end

-- customer by last name (2.5.2.2 / 2.6.2.2): all rows of that name sorted by
-- C_FIRST in one SELECT, the one at position ceil(n/2) is taken
local function customer_by_name(w, d, last, cols)
   nstmt = nstmt + 1
   local rs = con:query(string.format("SELECT c_id, %s FROM customer WHERE c_w_id = %d AND c_d_id = %d "
                                         .. "AND c_last = '%s' ORDER BY c_first", cols, w, d, last))
   local pick, row = math.ceil(rs.nrows / 2)
   for k = 1, rs.nrows do
      local r = rs:fetch_row()
      if k == pick then row = r end
   end
   return tonumber(row[1])
end

-- Payment, clause 2.5: 7 statements (warehouse update+select, district
-- update+select, customer select (by id or by name), customer update, history)
local function gen_payment()
   local p = {w = home_w, d = rand(1, DIST_PER_WARE), amount = rand(100, 500000) / 100}
   if W > 1 and rand(1, 100) > 85 then            -- 15 % remote customer (2.5.1.2)
      p.cw, p.cd = other_warehouse(p.w), rand(1, DIST_PER_WARE)
   else
      p.cw, p.cd = p.w, p.d
   end
   if rand(1, 100) <= 60 then p.last = lastname(NURand(255, 0, 999, C_LAST_RUN))   -- 60 % by name
   else p.c = NURand(1023, 1, CUST_PER_DIST, C_ID) end
   return p
end

local function payment(p)
   local w, d = p.w, p.d
   query(string.format("UPDATE warehouse SET w_ytd = w_ytd + %.2f WHERE w_id = %d", p.amount, w))
   local wr = query_row(string.format("SELECT w_street_1, w_street_2, w_city, w_state, w_zip, w_name "
                                         .. "FROM warehouse WHERE w_id = %d", w))
   query(string.format("UPDATE district SET d_ytd = d_ytd + %.2f WHERE d_w_id = %d AND d_id = %d", p.amount, w, d))
   local dr = query_row(string.format("SELECT d_street_1, d_street_2, d_city, d_state, d_zip, d_name "
                                         .. "FROM district WHERE d_w_id = %d AND d_id = %d", w, d))
   local c = p.c
   local cols = "c_first, c_middle, c_last, c_street_1, c_street_2, c_city, c_state, c_zip, c_phone, c_since, "
      .. "c_credit, c_credit_lim, c_discount, c_balance"
   if p.last then
      c = customer_by_name(p.cw, p.cd, p.last, cols)
   else
      query_row(string.format("SELECT c_id, %s FROM customer WHERE c_w_id = %d AND c_d_id = %d "
                                 .. "AND c_id = %d", cols, p.cw, p.cd, c))
   end
   -- bad credit: C_DATA gets the payment's ids and amount in front, kept to 500 chars (2.5.2.2)
   query(string.format("UPDATE customer SET c_balance = c_balance - %.2f, c_ytd_payment = c_ytd_payment + %.2f, "
                          .. "c_payment_cnt = c_payment_cnt + 1, c_data = IF(c_credit = 'BC', "
                          .. "LEFT(CONCAT('%d %d %d %d %d %.2f | ', c_data), 500), c_data) "
                          .. "WHERE c_w_id = %d AND c_d_id = %d AND c_id = %d",
                       p.amount, p.amount, c, p.cd, p.cw, d, w, p.amount, p.cw, p.cd, c))
   query(string.format("INSERT INTO history (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data) "
                          .. "VALUES (%d, %d, %d, %d, %d, NOW(), %.2f, '%s')",
                       c, p.cd, p.cw, d, w, p.amount, (wr[6] .. "    " .. dr[6]):sub(1, 24)))
   return "commit"
end

-- Order-Status, clause 2.6: 3 statements (customer, last order, its lines)
local function gen_order_status()
   local p = {w = home_w, d = rand(1, DIST_PER_WARE)}
   if rand(1, 100) <= 60 then p.last = lastname(NURand(255, 0, 999, C_LAST_RUN))
   else p.c = NURand(1023, 1, CUST_PER_DIST, C_ID) end
   return p
end

local function order_status(p)
   local w, d, c = p.w, p.d, p.c
   if p.last then
      c = customer_by_name(w, d, p.last, "c_balance, c_first, c_middle, c_last")
   else
      query_row(string.format("SELECT c_balance, c_first, c_middle, c_last FROM customer WHERE c_w_id = %d "
                                 .. "AND c_d_id = %d AND c_id = %d", w, d, c))
   end
   local o = query_row(string.format("SELECT o_id, o_carrier_id, o_entry_d FROM orders WHERE o_w_id = %d "
                                        .. "AND o_d_id = %d AND o_c_id = %d ORDER BY o_id DESC LIMIT 1", w, d, c))
   query(string.format("SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM order_line "
                          .. "WHERE ol_w_id = %d AND ol_d_id = %d AND ol_o_id = %d", w, d, tonumber(o[1])))
   return "commit"
end

-- Delivery, clause 2.7, run in-line (not deferred) over the 10 districts:
-- 7 statements per district (oldest NEW-ORDER FOR UPDATE, delete it, its
-- customer, carrier, delivery dates, amount, customer update), 1 when a
-- district has no undelivered order (skipped, 2.7.4.2; counted)
local function gen_delivery()
   return {w = home_w, carrier = rand(1, 10)}
end

local function delivery(p)
   local w = p.w
   for d = 1, DIST_PER_WARE do
      local r = query_row(string.format("SELECT no_o_id FROM new_orders WHERE no_w_id = %d AND no_d_id = %d "
                                           .. "ORDER BY no_o_id LIMIT 1 FOR UPDATE", w, d))
      if r == nil then
         count("delivery_skipped_districts")
      else
         local o = tonumber(r[1])
         query(string.format("DELETE FROM new_orders WHERE no_w_id = %d AND no_d_id = %d AND no_o_id = %d", w, d, o))
         local c = tonumber(query_row(string.format("SELECT o_c_id FROM orders WHERE o_w_id = %d AND o_d_id = %d "
                                                       .. "AND o_id = %d", w, d, o))[1])
         query(string.format("UPDATE orders SET o_carrier_id = %d WHERE o_w_id = %d AND o_d_id = %d AND o_id = %d",
                             p.carrier, w, d, o))
         query(string.format("UPDATE order_line SET ol_delivery_d = NOW() WHERE ol_w_id = %d AND ol_d_id = %d "
                                .. "AND ol_o_id = %d", w, d, o))
         local amt = query_row(string.format("SELECT SUM(ol_amount) FROM order_line WHERE ol_w_id = %d "
                                                .. "AND ol_d_id = %d AND ol_o_id = %d", w, d, o))[1]
         query(string.format("UPDATE customer SET c_balance = c_balance + %s, c_delivery_cnt = c_delivery_cnt + 1 "
                                .. "WHERE c_w_id = %d AND c_d_id = %d AND c_id = %d", amt or "0", w, d, c))
      end
   end
   return "commit"
end

-- Stock-Level, clause 2.8: 2 statements (next order id, distinct low-stock
-- items of the district's last 20 orders); fixed district per terminal (2.8.1.1)
local function gen_stock_level()
   return {w = home_w, d = stock_d, threshold = rand(10, 20)}
end

local function stock_level(p)
   local r = query_row(string.format("SELECT d_next_o_id FROM district WHERE d_w_id = %d AND d_id = %d", p.w, p.d))
   local next_o = tonumber(r[1])
   -- STRAIGHT_JOIN: ORDER-LINE's ~200 rows first, then STOCK by primary key
   query_row(string.format("SELECT STRAIGHT_JOIN COUNT(DISTINCT s_i_id) FROM order_line, stock WHERE ol_w_id = %d "
                              .. "AND ol_d_id = %d AND ol_o_id < %d AND ol_o_id >= %d AND s_w_id = %d "
                              .. "AND s_i_id = ol_i_id AND s_quantity < %d",
                           p.w, p.d, next_o, next_o - 20, p.w, p.threshold))
   return "commit"
end

local TYPES = {
   {name = "new_order", gen = gen_new_order, run = new_order},
   {name = "payment", gen = gen_payment, run = payment},
   {name = "order_status", gen = gen_order_status, run = order_status},
   {name = "delivery", gen = gen_delivery, run = delivery},
   {name = "stock_level", gen = gen_stock_level, run = stock_level},
}

-- ---------------------------------------------------------------- the mix (5.2.3, 5.2.4.2)
-- A deck of 100 cards holding each type as often as its percentage
-- (clause 5.2.4.2's "deck" method), shuffled once with a fixed seed; thread t
-- starts at card floor(t * 100 / threads) and walks the deck in order, so the
-- threads together draw near the nominal mix even in a short run.  After a
-- full pass a thread reshuffles its copy with its own seed.  Deterministic
-- per thread (independent of sysbench's random stream).
local deck, deck_pos, deck_seed

local function lcg(seed)       -- Park-Miller minimal standard generator; exact in doubles
   seed = (seed * 16807) % 2147483647
   return seed
end
local function shuffle(d)
   for i = #d, 2, -1 do
      deck_seed = lcg(deck_seed)
      local j = deck_seed % i + 1
      d[i], d[j] = d[j], d[i]
   end
end

local function make_deck()
   local pct, d = {}, {}
   for v in string.gmatch(sysbench.opt.mix, "[^,]+") do pct[#pct + 1] = tonumber(v) end
   assert(#pct == 5, "--mix needs 5 percentages")
   local sum = 0
   for k = 1, 5 do
      sum = sum + pct[k]
      for _ = 1, pct[k] do d[#d + 1] = k end
   end
   assert(sum == 100, "--mix must add up to 100")
   deck_seed = 20251125
   shuffle(d)
   return d
end

function thread_init(thread_id)
   W = sysbench.opt.warehouses
   tid = thread_id
   seed_rng(tid)
   drv = sysbench.sql.driver()
   con = drv:connect()
   home_w = tid % W + 1                                     -- terminals spread over the warehouses
   stock_d = math.floor(tid / W) % DIST_PER_WARE + 1
   deck = make_deck()
   deck_pos = math.floor(tid * #deck / sysbench.opt.threads)
   deck_seed = 1000003 + tid
   for _, t in ipairs(TYPES) do counts[t.name] = 0 end
   counts.new_order_rollback, counts.retries, counts.payment_by_name, counts.order_status_by_name = 0, 0, 0, 0
   counts.delivery_skipped_districts, counts.remote_order_lines, counts.remote_payments = 0, 0, 0
end

local function draw()
   if deck_pos >= #deck then deck_pos = 0; shuffle(deck) end
   deck_pos = deck_pos + 1
   return TYPES[deck[deck_pos]]
end

local done = 0

function event()
   if sysbench.opt.thread_events > 0 and done >= sysbench.opt.thread_events then
      return true                  -- this thread is done (sysbench's thread_run stops on true)
   end
   done = done + 1
   local t = draw()
   local p = t.gen()
   while true do
      nstmt = 0
      con:query("BEGIN")
      local ok, res = pcall(t.run, p)
      if ok then
         if res == "rollback" then
            con:query("ROLLBACK")
            count("new_order_rollback")
         else
            con:query("COMMIT")
            count(t.name)
         end
         count("stmts_" .. t.name, nstmt)
         break
      end
      if type(res) == "table" and res.errcode == sysbench.error.RESTART_EVENT then
         -- deadlock / lock wait timeout: roll back, mark the failed attempt, retry the same input
         con:query("ROLLBACK")
         con:query("DO 0")
         count("retries")
         count("retry_" .. t.name)
      else
         error(res, 0)
      end
   end
   if t.name == "payment" then
      if p.last then count("payment_by_name") end
      if p.cw ~= p.w then count("remote_payments") end
   elseif t.name == "order_status" and p.last then
      count("order_status_by_name")
   elseif t.name == "new_order" then
      for _, l in ipairs(p.lines) do if l.sw ~= p.w then count("remote_order_lines") end end
   end
end

function thread_done()
   local keys = {}
   for k in pairs(counts) do keys[#keys + 1] = k end
   table.sort(keys)
   local parts = {}
   for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. counts[k] end
   -- one write per line, so lines of concurrently finishing threads do not interleave
   io.stdout:write(string.format("tpcc-mix: thread=%d %s\n", tid, table.concat(parts, " ")))
   io.stdout:flush()
   con:disconnect()
end
