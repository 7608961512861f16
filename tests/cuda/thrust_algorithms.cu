// nvcc flags: --extended-lambda
// Thrust's algorithms as public programs use them: device vectors built, filled and copied
// back, sequence, transform with a functor and a device lambda, reduce, transform_reduce,
// scans, sorts (radix sort of int and float keys, sort_by_key, stable_sort with a comparator:
// the merge sort), unique, copy_if/remove_if, reduce_by_key, count, min/max_element,
// gather/scatter, merge, set operations and binary search; iterators (counting, zip,
// transform), for_each, a policy on a stream of the program's, thrust::random and the smaller
// algorithms. Every result is checked against the same computation on the host; values are
// small integers (exact in float), so sums do not depend on how the GPU splits the work.
#include "check.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/extrema.h>
#include <thrust/functional.h>
#include <thrust/gather.h>
#include <thrust/host_vector.h>
#include <thrust/merge.h>
#include <thrust/reduce.h>
#include <thrust/remove.h>
#include <thrust/scan.h>
#include <thrust/scatter.h>
#include <thrust/sequence.h>
#include <thrust/set_operations.h>
#include <thrust/sort.h>
#include <thrust/system_error.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>
#include <thrust/unique.h>
#include <thrust/adjacent_difference.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/inner_product.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/zip_iterator.h>
#include <thrust/logical.h>
#include <thrust/partition.h>
#include <thrust/random.h>
#include <thrust/replace.h>
#include <thrust/reverse.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/tabulate.h>
#include <thrust/tuple.h>

static int failures = 0;

static void report(const char *what, bool ok) {
    std::printf("%-28s %s\n", what, ok ? "ok" : "WRONG");
    if (!ok) failures++;
}

// A deterministic pseudo-random sequence (the same on every machine).
static std::vector<int> pseudo_random(int n, int modulo, unsigned seed) {
    std::vector<int> v(n);
    unsigned x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (int)((x >> 8) % (unsigned)modulo);
    }
    return v;
}

template <typename T>
static std::vector<T> to_host(const thrust::device_vector<T> &d) {
    thrust::host_vector<T> h = d;
    return std::vector<T>(h.begin(), h.end());
}

struct saxpy {
    int a;
    __host__ __device__ int operator()(int x, int y) const { return a * x + y; }
};

struct square_int {
    __host__ __device__ int operator()(int x) const { return x * x % 1000; }
};

struct square {
    __host__ __device__ long long operator()(int x) const { return (long long)x * x; }
};

// Programs' own maximum (CCCL 3 renamed the library's functors).
struct max_of {
    __host__ __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

struct is_odd {
    __host__ __device__ bool operator()(int x) const { return (x & 1) != 0; }
};

// Descending by the last digit, then ascending by the rest: ties keep their input order only
// in a stable sort.
struct by_last_digit_desc {
    __host__ __device__ bool operator()(int a, int b) const { return a % 10 > b % 10; }
};

static void basics(int n) {
    thrust::device_vector<int> d(n);
    thrust::sequence(d.begin(), d.end(), 5, 3);
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = 5 + 3 * i;
    report("sequence", to_host(d) == h);

    thrust::device_vector<int> filled(n, 7);
    report("fill construction", to_host(filled) == std::vector<int>(n, 7));

    thrust::device_vector<int> copy = d;
    report("device copy", to_host(copy) == h);

    thrust::device_vector<int> out(n);
    thrust::transform(d.begin(), d.end(), filled.begin(), out.begin(), saxpy{2});
    std::vector<int> want(n);
    for (int i = 0; i < n; i++) want[i] = 2 * h[i] + 7;
    report("transform (functor)", to_host(out) == want);

    thrust::transform(d.begin(), d.end(), out.begin(), [] __device__(int x) { return x * x - 1; });
    for (int i = 0; i < n; i++) want[i] = h[i] * h[i] - 1;
    report("transform (lambda)", to_host(out) == want);

    long long sum = thrust::reduce(d.begin(), d.end(), 0LL);
    long long host_sum = std::accumulate(h.begin(), h.end(), 0LL);
    report("reduce", sum == host_sum);
    int biggest = thrust::reduce(d.begin(), d.end(), -1, max_of());
    report("reduce (maximum)", biggest == h[n - 1]);

    long long squares = thrust::transform_reduce(d.begin(), d.end(), square(), 0LL, thrust::plus<long long>());
    long long host_squares = 0;
    for (int v : h) host_squares += (long long)v * v;
    report("transform_reduce", squares == host_squares);
    std::printf("  sum %lld, sum of squares %lld\n", sum, squares);

    std::vector<float> hf(n);
    for (int i = 0; i < n; i++) hf[i] = (float)(i % 17) - 8.0f;
    thrust::device_vector<float> df(hf.begin(), hf.end());
    float fsum = thrust::reduce(df.begin(), df.end(), 0.0f);
    report("reduce (float)", fsum == (float)std::accumulate(hf.begin(), hf.end(), 0.0));
    std::printf("  float sum %.1f\n", fsum);
}

static void scans(int n) {
    std::vector<int> h = pseudo_random(n, 100, 1);
    thrust::device_vector<int> d(h.begin(), h.end());
    thrust::device_vector<int> out(n);

    thrust::inclusive_scan(d.begin(), d.end(), out.begin());
    std::vector<int> want(n);
    std::partial_sum(h.begin(), h.end(), want.begin());
    report("inclusive_scan", to_host(out) == want);

    thrust::exclusive_scan(d.begin(), d.end(), out.begin(), 10);
    int running = 10;
    for (int i = 0; i < n; i++) {
        want[i] = running;
        running += h[i];
    }
    report("exclusive_scan", to_host(out) == want);

    thrust::inclusive_scan(d.begin(), d.end(), out.begin(), max_of());
    int m = h[0];
    for (int i = 0; i < n; i++) want[i] = m = std::max(m, h[i]);
    report("inclusive_scan (maximum)", to_host(out) == want);
    std::printf("  last of the exclusive scan %d\n", running - h[n - 1]);
}

static void sorts(int n) {
    std::vector<int> h = pseudo_random(n, 1 << 20, 2);
    for (int i = 0; i < n; i += 7) h[i] = -h[i];
    thrust::device_vector<int> d(h.begin(), h.end());
    thrust::sort(d.begin(), d.end());
    std::vector<int> want = h;
    std::sort(want.begin(), want.end());
    report("sort (int)", to_host(d) == want);
    std::printf("  first %d, last %d\n", want[0], want[n - 1]);

    std::vector<float> hf(n);
    for (int i = 0; i < n; i++) hf[i] = (float)(h[i] % 1000) * 0.5f;
    thrust::device_vector<float> df(hf.begin(), hf.end());
    thrust::sort(df.begin(), df.end(), thrust::greater<float>());
    std::vector<float> wantf = hf;
    std::sort(wantf.begin(), wantf.end(), std::greater<float>());
    report("sort (float, descending)", to_host(df) == wantf);

    std::vector<int> keys = pseudo_random(n, 50, 3);
    std::vector<int> values(n);
    std::iota(values.begin(), values.end(), 0);
    thrust::device_vector<int> dk(keys.begin(), keys.end()), dv(values.begin(), values.end());
    thrust::sort_by_key(dk.begin(), dk.end(), dv.begin());
    // Thrust's sort_by_key of primitive keys is stable: equal keys keep their input order.
    std::vector<std::pair<int, int>> pairs(n);
    for (int i = 0; i < n; i++) pairs[i] = {keys[i], values[i]};
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const std::pair<int, int> &a, const std::pair<int, int> &b) { return a.first < b.first; });
    std::vector<int> want_keys(n), want_values(n);
    for (int i = 0; i < n; i++) {
        want_keys[i] = pairs[i].first;
        want_values[i] = pairs[i].second;
    }
    report("sort_by_key", to_host(dk) == want_keys && to_host(dv) == want_values);

    std::vector<int> hs = pseudo_random(n, 1000, 4);
    thrust::device_vector<int> ds(hs.begin(), hs.end());
    thrust::stable_sort(ds.begin(), ds.end(), by_last_digit_desc());
    std::vector<int> wants = hs;
    std::stable_sort(wants.begin(), wants.end(), [](int a, int b) { return a % 10 > b % 10; });
    report("stable_sort (comparator)", to_host(ds) == wants);
    std::printf("  stable first %d, last %d\n", wants[0], wants[n - 1]);

    // The merge sort with a device lambda, of pairs by key.
    thrust::device_vector<int> mk(keys.begin(), keys.end()), mv(values.begin(), values.end());
    thrust::stable_sort_by_key(mk.begin(), mk.end(), mv.begin(), [] __device__(int a, int b) { return a > b; });
    std::stable_sort(pairs.begin(), pairs.end(),
                     [](const std::pair<int, int> &a, const std::pair<int, int> &b) { return a.first > b.first; });
    for (int i = 0; i < n; i++) {
        want_keys[i] = pairs[i].first;
        want_values[i] = pairs[i].second;
    }
    report("stable_sort_by_key (lambda)", to_host(mk) == want_keys && to_host(mv) == want_values);
}

static void selections(int n) {
    std::vector<int> h = pseudo_random(n, 20, 5);
    std::sort(h.begin(), h.end());
    thrust::device_vector<int> d(h.begin(), h.end());
    auto end = thrust::unique(d.begin(), d.end());
    int unique_count = (int)(end - d.begin());
    std::vector<int> want = h;
    want.erase(std::unique(want.begin(), want.end()), want.end());
    d.resize(unique_count);
    report("unique", to_host(d) == want);

    std::vector<int> r = pseudo_random(n, 1000, 6);
    thrust::device_vector<int> dr(r.begin(), r.end());
    thrust::device_vector<int> odd(n);
    auto odd_end = thrust::copy_if(dr.begin(), dr.end(), odd.begin(), is_odd());
    odd.resize(odd_end - odd.begin());
    std::vector<int> want_odd;
    std::copy_if(r.begin(), r.end(), std::back_inserter(want_odd), [](int x) { return (x & 1) != 0; });
    report("copy_if", to_host(odd) == want_odd);

    auto kept_end = thrust::remove_if(dr.begin(), dr.end(), is_odd());
    dr.resize(kept_end - dr.begin());
    std::vector<int> want_even;
    std::copy_if(r.begin(), r.end(), std::back_inserter(want_even), [](int x) { return (x & 1) == 0; });
    report("remove_if", to_host(dr) == want_even);

    thrust::device_vector<int> all(r.begin(), r.end());
    int odds = (int)thrust::count_if(all.begin(), all.end(), is_odd());
    int sevens = (int)thrust::count(all.begin(), all.end(), 7);
    report("count/count_if",
           odds == (int)want_odd.size() && sevens == (int)std::count(r.begin(), r.end(), 7));
    auto mn = thrust::min_element(all.begin(), all.end());
    auto mx = thrust::max_element(all.begin(), all.end());
    int host_min = (int)(std::min_element(r.begin(), r.end()) - r.begin());
    int host_max = (int)(std::max_element(r.begin(), r.end()) - r.begin());
    report("min/max_element", (int)(mn - all.begin()) == host_min && (int)(mx - all.begin()) == host_max &&
                                  *mn == r[host_min] && *mx == r[host_max]);
    std::printf("  unique %d, odd %d, sevens %d, min %d at %d, max %d at %d\n", unique_count, odds, sevens,
                r[host_min], host_min, r[host_max], host_max);

    // reduce_by_key over runs of equal keys.
    std::vector<int> keys(n), vals(n);
    for (int i = 0; i < n; i++) {
        keys[i] = i / 37;
        vals[i] = i % 11;
    }
    thrust::device_vector<int> dk(keys.begin(), keys.end()), dv(vals.begin(), vals.end());
    thrust::device_vector<int> ok(n), ov(n);
    auto ends = thrust::reduce_by_key(dk.begin(), dk.end(), dv.begin(), ok.begin(), ov.begin());
    int runs = (int)(ends.first - ok.begin());
    std::vector<int> want_k, want_v;
    for (int i = 0; i < n; i++) {
        if (i == 0 || keys[i] != keys[i - 1]) {
            want_k.push_back(keys[i]);
            want_v.push_back(0);
        }
        want_v.back() += vals[i];
    }
    ok.resize(runs);
    ov.resize(runs);
    report("reduce_by_key", to_host(ok) == want_k && to_host(ov) == want_v);
    std::printf("  %d runs, last sums to %d\n", runs, want_v.back());
}

static void permutations(int n) {
    std::vector<int> src(n), map(n);
    for (int i = 0; i < n; i++) {
        src[i] = i * 10;
        map[i] = (int)(((long long)i * 7919) % n);  // a permutation: 7919 is prime, n is not a multiple
    }
    thrust::device_vector<int> ds(src.begin(), src.end()), dm(map.begin(), map.end()), out(n);
    thrust::gather(dm.begin(), dm.end(), ds.begin(), out.begin());
    std::vector<int> want(n);
    for (int i = 0; i < n; i++) want[i] = src[map[i]];
    report("gather", to_host(out) == want);
    thrust::scatter(ds.begin(), ds.end(), dm.begin(), out.begin());
    for (int i = 0; i < n; i++) want[map[i]] = src[i];
    report("scatter", to_host(out) == want);
}

static void sets(int n) {
    std::vector<int> a = pseudo_random(n, 3 * n, 7), b = pseudo_random(n / 2, 3 * n, 8);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    thrust::device_vector<int> da(a.begin(), a.end()), db(b.begin(), b.end());
    thrust::device_vector<int> out(a.size() + b.size());

    auto end = thrust::merge(da.begin(), da.end(), db.begin(), db.end(), out.begin());
    std::vector<int> want(a.size() + b.size());
    std::merge(a.begin(), a.end(), b.begin(), b.end(), want.begin());
    report("merge", (size_t)(end - out.begin()) == want.size() && to_host(out) == want);

    auto check = [&](const char *what, thrust::device_vector<int>::iterator e, std::vector<int> w) {
        std::vector<int> got = to_host(out);
        got.resize(e - out.begin());
        report(what, got == w);
        return (int)w.size();
    };
    std::vector<int> w;
    std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(w));
    int u = check("set_union", thrust::set_union(da.begin(), da.end(), db.begin(), db.end(), out.begin()), w);
    w.clear();
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(w));
    int x = check("set_intersection",
                  thrust::set_intersection(da.begin(), da.end(), db.begin(), db.end(), out.begin()), w);
    w.clear();
    std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(w));
    int d = check("set_difference", thrust::set_difference(da.begin(), da.end(), db.begin(), db.end(), out.begin()),
                  w);
    std::printf("  union %d, intersection %d, difference %d\n", u, x, d);

    // lower_bound and binary_search of every value of b in a.
    thrust::device_vector<int> found(b.size());
    thrust::lower_bound(da.begin(), da.end(), db.begin(), db.end(), found.begin());
    std::vector<int> want_found(b.size());
    for (size_t i = 0; i < b.size(); i++) want_found[i] = (int)(std::lower_bound(a.begin(), a.end(), b[i]) - a.begin());
    report("lower_bound", to_host(found) == want_found);
    thrust::device_vector<bool> present(b.size());
    thrust::binary_search(da.begin(), da.end(), db.begin(), db.end(), present.begin());
    thrust::host_vector<bool> hp = present;
    bool same = true;
    for (size_t i = 0; i < b.size(); i++) same &= hp[i] == std::binary_search(a.begin(), a.end(), b[i]);
    report("binary_search", same);
    // The raw-pointer form with an explicit policy, as many programs write it.
    int *raw = thrust::raw_pointer_cast(da.data());
    int *where = thrust::lower_bound(thrust::device, raw, raw + a.size(), a[a.size() / 2]);
    report("lower_bound (thrust::device)", where - raw == (long)(a.size() / 2));
}

struct add_pair {
    __host__ __device__ int operator()(const thrust::tuple<int, int> &t) const {
        return thrust::get<0>(t) + 2 * thrust::get<1>(t);
    }
};

struct bump {
    int *counts;
    __device__ void operator()(int x) const { atomicAdd(&counts[x % 8], 1); }
};

// A pseudo-random draw per index, as Monte Carlo programs write it: the same sequence on the
// host and the device.
struct draw {
    __host__ __device__ unsigned operator()(int i) const {
        thrust::default_random_engine rng(1234u + 7919u * (unsigned)i);
        rng.discard(3);
        thrust::uniform_int_distribution<int> dist(0, 99);
        return (unsigned)dist(rng);
    }
};

struct below_50 {
    __host__ __device__ bool operator()(int x) const { return x < 50; }
};

// Iterators, for_each, a policy on a stream of the program's, memory of cudaMalloc's wrapped in
// a device_ptr, and the smaller algorithms.
static void more(int n) {
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    thrust::counting_iterator<int> first(0);
    thrust::device_vector<int> sq(n);
    thrust::transform(thrust::cuda::par.on(stream), first, first + n, sq.begin(), square_int());
    CHECK(cudaStreamSynchronize(stream));
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = i * i % 1000;
    report("counting_iterator on a stream", to_host(sq) == h);

    thrust::device_vector<int> idx(n);
    thrust::sequence(idx.begin(), idx.end());
    auto zip = thrust::make_zip_iterator(thrust::make_tuple(sq.begin(), idx.begin()));
    auto summed = thrust::make_transform_iterator(zip, add_pair());
    long long total = thrust::reduce(summed, summed + n, 0LL);
    long long host_total = 0;
    for (int i = 0; i < n; i++) host_total += h[i] + 2 * i;
    report("zip and transform iterators", total == host_total);

    int *raw;
    CHECK(cudaMalloc(&raw, 8 * sizeof(int)));
    CHECK(cudaMemset(raw, 0, 8 * sizeof(int)));
    thrust::device_ptr<int> counts = thrust::device_pointer_cast(raw);
    thrust::for_each(sq.begin(), sq.end(), bump{raw});
    std::vector<int> want_counts(8, 0);
    for (int v : h) want_counts[v % 8]++;
    std::vector<int> got_counts(counts, counts + 8);
    report("for_each (atomics), device_ptr", got_counts == want_counts);
    CHECK(cudaFree(raw));

    thrust::device_vector<unsigned> drawn(n);
    thrust::tabulate(drawn.begin(), drawn.end(), draw());
    std::vector<unsigned> want_drawn(n);
    for (int i = 0; i < n; i++) want_drawn[i] = draw()(i);
    report("tabulate (thrust::random)", to_host(drawn) == want_drawn);

    thrust::device_vector<int> v(sq);
    thrust::reverse(v.begin(), v.end());
    thrust::replace(v.begin(), v.end(), 0, -1);
    std::vector<int> want(h.rbegin(), h.rend());
    std::replace(want.begin(), want.end(), 0, -1);
    report("reverse, replace", to_host(v) == want);
    thrust::adjacent_difference(v.begin(), v.end(), v.begin());
    std::adjacent_difference(want.begin(), want.end(), want.begin());
    report("adjacent_difference", to_host(v) == want);

    long long dot = thrust::inner_product(sq.begin(), sq.end(), idx.begin(), 0LL);
    long long host_dot = 0;
    for (int i = 0; i < n; i++) host_dot += (long long)h[i] * i;
    bool all = thrust::all_of(sq.begin(), sq.end(), below_50());
    bool any = thrust::any_of(sq.begin(), sq.end(), below_50());
    report("inner_product, all_of, any_of", dot == host_dot && !all && any);
    thrust::device_vector<int> dh(h.begin(), h.end());
    report("equal", thrust::equal(sq.begin(), sq.end(), dh.begin()) && !thrust::equal(sq.begin(), sq.end(), idx.begin()) &&
                        thrust::equal(idx.begin(), idx.end(), first));

    thrust::device_vector<int> parts(sq);
    auto middle = thrust::stable_partition(parts.begin(), parts.end(), below_50());
    std::vector<int> want_parts = h;
    auto host_middle = std::stable_partition(want_parts.begin(), want_parts.end(), [](int x) { return x < 50; });
    report("stable_partition", middle - parts.begin() == host_middle - want_parts.begin() &&
                                   to_host(parts) == want_parts);
    thrust::fill(parts.begin(), parts.begin() + n / 2, 9);
    report("fill", thrust::count(parts.begin(), parts.end(), 9) >= n / 2);
    std::printf("  dot %lld, below 50 first %d\n", dot, (int)(host_middle - want_parts.begin()));
    CHECK(cudaStreamDestroy(stream));
}

int main() {
    try {
        basics(5000);
        scans(6000);
        sorts(20000);
        selections(4000);
        permutations(3000);
        sets(10000);
        more(4000);
        CHECK(cudaDeviceSynchronize());
    } catch (const thrust::system_error &e) {
        std::printf("FAILED: thrust::system_error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc &e) {
        std::printf("FAILED: bad_alloc: %s\n", e.what());
        return 1;
    }
    std::printf(failures == 0 ? "PASS\n" : "FAILED: %d wrong\n", failures);
    return failures == 0 ? 0 : 1;
}
