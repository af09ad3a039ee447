"""Many searches at once against a running archivist: how many answer, how
many are refused and why (reason, and whether a RetryInfo came). Run with
the Python client's virtualenv (clients/python/ci.sh makes it):

    python benches/search_busy.py ADDRESS 0 load    # 40 sessions of 500 texts, twice
    python benches/search_busy.py ADDRESS 120       # 120 searches of 3 words at once
    python benches/search_busy.py ADDRESS 120 phrase  # 4-word phrases instead

docs/benchmarks.md ("Busy or too costly") has the figures."""
import asyncio, collections, random, sys, time
from archivist_client import AsyncClient, Client, ArchivistError

ADDR = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 120
WORDS = ("release deploy database migration timeout friday budget report garden tomato "
         "kitchen invoice payment server outage backup restore meeting agenda travel "
         "flight hotel doctor appointment birthday present recipe pasta holiday").split()

def load(n_sessions=40, per=500):
    rnd = random.Random(7)
    with Client(ADDR) as c:
        for s in range(n_sessions):
            texts = [" ".join(rnd.choice(WORDS) for _ in range(12)) + f" note {s}-{i}" for i in range(per)]
            for k in range(0, per, 250):
                c.append(f"load-{s}", [("user", t) for t in texts[k:k+250]])

async def main():
    rnd = random.Random(11)
    if "phrase" in sys.argv:
        queries = ['"' + " ".join(rnd.sample(WORDS, 4)) + '"' for _ in range(N)]
    else:
        queries = [" ".join(rnd.sample(WORDS, 3)) for _ in range(N)]
    async with AsyncClient(ADDR) as c:
        async def one(q):
            try:
                await c.search(q, limit=10)
                return ("answered", None)
            except ArchivistError as e:
                retry = getattr(e, "retry_after", None)
                return (e.reason or e.code.name, retry is not None)
        t = time.monotonic()
        got = await asyncio.gather(*(one(q) for q in queries))
        took = time.monotonic() - t
    print(f"{N} searches at once, {took:.1f} s:", dict(collections.Counter(got)))

if __name__ == "__main__":
    if sys.argv[3:] == ["load"]:
        load()
    else:
        asyncio.run(main())
