// A program for a restore that finds one of its threads idle (tests/e2e/checkpoint.rs): a
// worker thread launches a kernel (its async call not answered yet when the session is
// stopped), then waits for the main thread, which reads the kernel's result with a
// synchronous copy after the restore. The worker does not call CUDA again until the main
// thread is done (PyTorch's autograd thread waits for its main thread like this), so its
// unanswered launch is sent again on its behalf by the main thread's new connection; the
// restored session knows it ran and must not run it twice (the kernel adds). Prints "ready",
// waits for a line on stdin (the session is stopped and restored meanwhile), then the value
// read and "PASS".
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include "check.h"

__global__ void add_value(int *p, int v) { atomicAdd(p, v); }

static std::mutex m;
static std::condition_variable cv;
static int stage = 0;  // 2: launched; 3: finish

static void wait_for(int s) {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return stage >= s; });
}

static void advance(int s) {
    {
        std::lock_guard<std::mutex> l(m);
        stage = s;
    }
    cv.notify_all();
}

int main() {
    int *value;
    CHECK(cudaMalloc(&value, sizeof(int)));
    CHECK(cudaMemset(value, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    bool worker_ready = false;
    std::thread worker([&] {
        // Its own connection, opened before the checkpoint, and the kernel launched once
        // (adding nothing) and waited for: the launch below goes without waiting.
        add_value<<<1, 1>>>(value, 0);
        CHECK(cudaDeviceSynchronize());
        {
            std::lock_guard<std::mutex> l(m);
            worker_ready = true;
        }
        cv.notify_all();
        add_value<<<1, 1>>>(value, 42);
        CHECK_LAUNCH();
        advance(2);
        // Idle until the main thread has read the result.
        wait_for(3);
    });
    {
        std::unique_lock<std::mutex> l(m);
        cv.wait(l, [&] { return worker_ready; });
    }
    wait_for(2);
    std::printf("ready\n");
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);
    int host = -1;
    CHECK(cudaMemcpy(&host, value, sizeof(int), cudaMemcpyDeviceToHost));
    std::printf("value %d\n", host);
    advance(3);
    worker.join();
    CHECK(cudaFree(value));
    EXPECT(host == 42);
    std::printf("PASS\n");
    return 0;
}
