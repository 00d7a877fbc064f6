-- workload.sql — the sqlite3 workload of bench/agent_bench.sh:
--   sqlite3 FRESH.db < workload.sql
-- run natively and under `sptrace run` on a new database file each time; the
-- two outputs must be identical.  Inserts, an index build, joins, grouping,
-- sorting and string functions: about 1-3 s natively on the benchmark machine.
PRAGMA journal_mode = OFF;
PRAGMA synchronous = OFF;
CREATE TABLE customer(id INTEGER PRIMARY KEY, name TEXT, region INTEGER);
CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER, amount REAL, note TEXT);
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
INSERT INTO customer SELECT i, 'customer-' || i, i % 37 FROM n;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 250000)
INSERT INTO orders SELECT i, (i * 7919) % 20000 + 1, (i * 104729) % 100000 / 100.0,
       printf('order %d of %s', i, hex(i * 31)) FROM n;
COMMIT;
CREATE INDEX orders_customer ON orders(customer);
SELECT count(*), sum(amount), max(length(note)) FROM orders;
SELECT c.region, count(*), round(sum(o.amount), 2), round(avg(o.amount), 4)
  FROM orders o JOIN customer c ON c.id = o.customer
  GROUP BY c.region ORDER BY c.region;
SELECT c.name, round(sum(o.amount), 2) AS total
  FROM customer c JOIN orders o ON o.customer = c.id
  GROUP BY c.id ORDER BY total DESC, c.id LIMIT 10;
SELECT substr(note, 1, 9), count(*) FROM orders
  WHERE note LIKE '%A%' GROUP BY substr(note, 1, 9) ORDER BY 2 DESC, 1 LIMIT 5;
UPDATE orders SET amount = amount * 1.1 WHERE customer % 3 = 0;
DELETE FROM orders WHERE id % 5 = 0;
SELECT count(*), round(sum(amount), 2) FROM orders;
SELECT region, group_concat(id, ',') FROM
  (SELECT region, id FROM customer WHERE id % 1000 = 0 ORDER BY id) GROUP BY region ORDER BY region LIMIT 5;
