/* The C ABI from C: compiled as C (C99) against the installed package by tests/consumer, and
 * in-tree by tests/CMakeLists.txt. Exits 0 when every check holds (or there is no device),
 * 1 with a message naming the failed check otherwise. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <vkad_c.h>

static int failures = 0;
#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "c_api_test:%d: check failed: %s\n", __LINE__, #cond); \
      ++failures;                                                            \
    }                                                                        \
  } while (0)
/* A call that must succeed; prints the error otherwise. */
#define OK(call)                                                         \
  do {                                                                   \
    vkad_status* st_ = (call);                                           \
    if (st_ != NULL) {                                                   \
      fprintf(stderr, "c_api_test:%d: %s failed: %s\n", __LINE__, #call, \
              vkad_status_message(st_));                                 \
      ++failures;                                                        \
      vkad_status_free(st_);                                             \
    }                                                                    \
  } while (0)

/* vkad_session_set_print_sink's: the lines a kernel printed, joined with '|'. */
static char printed[256];
static void on_print(const char* line, size_t length, void* user) {
  ++*(int*)user;
  if (strlen(line) != length) return; /* NUL-terminated at `length`: checked by the caller */
  if (printed[0] != '\0') strncat(printed, "|", sizeof printed - strlen(printed) - 1);
  strncat(printed, line, sizeof printed - strlen(printed) - 1);
}

static int log_calls = 0;
static void on_log(int level, const char* message, void* user) {
  (void)level;
  (void)message;
  ++*(int*)user;
}

/* loss = sum_i out[i] with out[i] = a * x[i] * x[i] * y[i]: d/dx = 2 a x y, d/dy = a x^2. */
static const char* kKernel =
    "kernel sq(a: f32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad, "
    "out: ndarray<f32, 1> grad) {\n"
    "  task main parallel %0 in [0, shape(x, 0)) {\n"
    "    %1 = load x[%0] : f32\n"
    "    %2 = load y[%0] : f32\n"
    "    %3 = arg a : f32\n"
    "    %4 = mul %3, %1 : f32\n"
    "    %5 = mul %4, %1 : f32\n"
    "    %6 = mul %5, %2 : f32\n"
    "    store out[%0], %6\n"
    "  }\n"
    "}\n";

/* x[t + 1, i] = 0.5 x[t, i] + 1: one step of a loop over the rows (vkad_launch_loop). */
static const char* kStep =
    "kernel halve(t: i32, x: ndarray<f32, 2>) {\n"
    "  task main parallel %0 in [0, shape(x, 1)) {\n"
    "    %1 = arg t : i32\n"
    "    %2 = load x[%1, %0] : f32\n"
    "    %3 = const 0.5 : f32\n"
    "    %4 = mul %2, %3 : f32\n"
    "    %5 = const 1 : f32\n"
    "    %6 = add %4, %5 : f32\n"
    "    %7 = const 1 : i32\n"
    "    %8 = add %1, %7 : i32\n"
    "    store x[%8, %0], %6\n"
    "  }\n"
    "}\n";

/* A step loop through the C ABI: rows 1..8 of x from row 0 = 0 are 2 - 2^(1-r) (exact in f32),
 * rolled into one resident kernel or not as `expect_rolled` says (the session's
 * resident_max_range); a step on the array is refused, naming it, with nothing run. */
static void step_loop(vkad_session* s, int expect_rolled) {
  enum { T = 8, W = 16 };
  uint32_t shape[2] = {T + 1, W};
  float host[(T + 1) * W];
  vkad_kernel k = 0;
  vkad_ndarray hx = 0;
  vkad_arg args[2];
  int32_t step[2] = {1, 0}, bad_step[2] = {0, 1};
  vkad_loop_launch body;
  vkad_status* st;
  int rolled = -1, r, i;
  OK(vkad_compile(s, kStep, &k));
  OK(vkad_ndarray_create(s, VKAD_F32, 2, shape, "x", &hx));
  OK(vkad_ndarray_zero(s, hx));
  args[0] = vkad_arg_i32(0);
  args[1] = vkad_arg_ndarray(hx);
  body.kernel = k;
  body.args = args;
  body.arg_count = 2;
  body.step = bad_step;
  st = vkad_launch_loop(s, &body, 1, T, &rolled);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "not an i32 scalar") != NULL);
  vkad_status_free(st);
  CHECK(rolled == 0);
  body.step = step;
  /* An i32 argument out of range with a step: refused before the stepping arithmetic. */
  args[0].i = INT64_MAX;
  st = vkad_launch_loop(s, &body, 1, T, &rolled);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  vkad_status_free(st);
  args[0] = vkad_arg_i32(0);
  OK(vkad_launch_loop(s, &body, 1, T, &rolled));
  CHECK(rolled == expect_rolled); /* 8 iterations of 16 elements: one resident kernel */
  OK(vkad_download(s, hx, host, sizeof host));
  for (r = 0; r <= T; ++r) {
    for (i = 0; i < W; ++i)
      CHECK(host[r * W + i] == (r == 0 ? 0.0f : (float)(2.0 - pow(2.0, 1 - r))));
  }
  if (expect_rolled) {
    /* Captured, the rolled loop is launch 0 of the graph, its parameters the resident
     * kernel's: an update in the body's numbering is refused, naming the loop. */
    vkad_graph g = 0;
    vkad_graph_update u;
    OK(vkad_begin_capture(s, "c loop"));
    OK(vkad_launch_loop(s, &body, 1, T, &rolled));
    OK(vkad_end_capture(s, &g));
    u.launch = 0;
    u.param = 0;
    u.value = vkad_arg_i32(1);
    st = vkad_replay(s, g, &u, 1, NULL);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(st != NULL && strstr(vkad_status_message(st), "made by a launch_loop") != NULL);
    vkad_status_free(st);
    OK(vkad_replay(s, g, NULL, 0, NULL));
    OK(vkad_graph_release(s, g));
  }
  OK(vkad_ndarray_free(s, hx));
  OK(vkad_kernel_release(s, k));
}

int main(void) {
  vkad_session* s = NULL;
  vkad_session_options opts;
  vkad_status* st;
  enum { N = 257 };
  float x[N], y[N], gx[N], gy[N];
  uint32_t shape[1] = {N};
  vkad_ndarray hx, hy, ho, hgx, hgy, hgo;
  vkad_differentiated d;
  vkad_stats stats;
  vkad_kernel bad_kernel = 0;
  uint64_t launch_id = 0;
  int i;

  CHECK(vkad_version() == ((VKAD_C_API_VERSION_MAJOR << 22) | (VKAD_C_API_VERSION_MINOR << 12) |
                           VKAD_C_API_VERSION_PATCH));
  CHECK(strlen(vkad_version_string()) >= 5);
  vkad_set_log_callback(on_log, &log_calls);

  /* Misuse is an error value, never a crash. */
  st = vkad_session_create(NULL, NULL);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "out is NULL") != NULL);
  vkad_status_free(st);
  st = vkad_compile(NULL, kKernel, &bad_kernel);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "session is NULL") != NULL);
  vkad_status_free(st);
  CHECK(vkad_status_code(NULL) == VKAD_OK);
  vkad_status_free(NULL);
  memset(&opts, 0, sizeof opts);
  opts.struct_size = sizeof opts + 8; /* from a "newer" header */
  st = vkad_session_create(&opts, &s);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "struct_size") != NULL);
  vkad_status_free(st);

  opts.struct_size = sizeof opts;
  opts.spare_memory_blocks = -2; /* 0, -1 or a count */
  st = vkad_session_create(&opts, &s);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "spare_memory_blocks -2") != NULL);
  CHECK(s == NULL);
  vkad_status_free(st);

  opts.validation = 1;
  opts.spare_memory_blocks = -1; /* give every empty block back */
  opts.cache_dir = "";           /* no on-disk caches: the test writes nowhere */
  st = vkad_session_create(&opts, &s);
  if (vkad_status_code(st) == VKAD_NO_DEVICE) {
    printf("c_api_test: SKIPPED: no Vulkan device (%s)\n", vkad_status_message(st));
    vkad_status_free(st);
    return failures == 0 ? 0 : 1;
  }
  CHECK(st == NULL);
  if (st != NULL) {
    fprintf(stderr, "c_api_test: %s\n", vkad_status_message(st));
    vkad_status_free(st);
    return 1;
  }
  printf("c_api_test: running on %s\n", vkad_session_device_name(s));

  /* A parse error names the line. */
  st = vkad_compile(s, "kernel k(x: ndarray<f32, 1>) {\n  oops\n}\n", &bad_kernel);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "line") != NULL);
  vkad_status_free(st);
  CHECK(bad_kernel == 0); /* out-parameters are written only on success */

  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  OK(vkad_differentiate(s, kKernel, &d));
  CHECK(d.forward != 0 && d.adjoint != 0 && d.forward != d.adjoint);
  CHECK(d.forward_params == 4);
  CHECK(d.gradient_count == 3);
  CHECK(d.gradients[0].param == 1 && d.gradients[0].grad_param == 4);
  CHECK(d.gradients[1].param == 2 && d.gradients[1].grad_param == 5);
  CHECK(d.gradients[2].param == 3 && d.gradients[2].grad_param == 6);

  for (i = 0; i < N; ++i) {
    x[i] = 0.01f * (float)(i % 50) - 0.2f;
    y[i] = 1.0f + 0.003f * (float)i;
  }
  OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "x", &hx));
  OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "y", &hy));
  OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "out", &ho));
  OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "x_grad", &hgx));
  OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "y_grad", &hgy));
  OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "out_grad", &hgo));
  OK(vkad_upload(s, hx, x, sizeof x));
  OK(vkad_upload(s, hy, y, sizeof y));
  OK(vkad_ndarray_zero(s, hgx));
  OK(vkad_ndarray_zero(s, hgy));
  OK(vkad_ndarray_fill(s, hgo, 1.0));
  {
    vkad_arg fargs[4];
    vkad_arg aargs[7];
    fargs[0] = vkad_arg_f32(1.5f);
    fargs[1] = vkad_arg_ndarray(hx);
    fargs[2] = vkad_arg_ndarray(hy);
    fargs[3] = vkad_arg_ndarray(ho);
    memcpy(aargs, fargs, sizeof fargs);
    aargs[4] = vkad_arg_ndarray(hgx);
    aargs[5] = vkad_arg_ndarray(hgy);
    aargs[6] = vkad_arg_ndarray(hgo);
    /* prepare makes the launch's pipelines, launches nothing (the first launch is still 1). */
    OK(vkad_prepare(s, d.adjoint, aargs, 7));
    st = vkad_prepare(s, d.adjoint, aargs, 6);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    OK(vkad_launch(s, d.forward, fargs, 4, &launch_id));
    CHECK(launch_id == 1);
    OK(vkad_launch(s, d.adjoint, aargs, 7, &launch_id));
    CHECK(launch_id == 2);
    /* Wrong argument count: an error naming the kernel, nothing recorded. */
    st = vkad_launch(s, d.forward, fargs, 3, &launch_id);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "sq") != NULL);
    vkad_status_free(st);
    CHECK(launch_id == 2);
  }
  OK(vkad_flush(s));
  OK(vkad_download(s, hgx, gx, sizeof gx));
  OK(vkad_download(s, hgy, gy, sizeof gy));
  for (i = 0; i < N; ++i) {
    /* Closed forms; f32 products, a few ulp. */
    double ex = 2.0 * 1.5 * x[i] * y[i], ey = 1.5 * x[i] * x[i];
    if (fabs(gx[i] - ex) > 1e-5 * (1 + fabs(ex)) || fabs(gy[i] - ey) > 1e-5 * (1 + fabs(ey))) {
      fprintf(stderr, "c_api_test: gradient %d: got %g %g want %g %g\n", i, gx[i], gy[i], ex, ey);
      ++failures;
      break;
    }
  }
  /* A tape: launches recorded, gradients made by the first backward and reused after it. */
  {
    vkad_tape* tape = NULL;
    vkad_arg fargs[4];
    vkad_seed seed;
    vkad_ndarray g = 0, other = 0;
    uint64_t ndarrays_after_first = 0;
    float ones[N];
    int it;
    fargs[0] = vkad_arg_f32(1.5f);
    fargs[1] = vkad_arg_ndarray(hx);
    fargs[2] = vkad_arg_ndarray(hy);
    fargs[3] = vkad_arg_ndarray(ho);
    for (i = 0; i < N; ++i) ones[i] = 1.0f;
    st = vkad_tape_create(NULL, &tape);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "session is NULL") != NULL);
    vkad_status_free(st);
    OK(vkad_tape_create(s, &tape));
    st = vkad_tape_backward(tape, NULL, 0);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "no launch of a differentiated kernel") != NULL);
    vkad_status_free(st);
    OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "other", &other));
    {
      /* Intermediate gradients: kept without checkpointing, zero where overwritten with it. */
      int keeps = -1;
      OK(vkad_tape_keeps_intermediate_gradients(tape, &keeps));
      CHECK(keeps == 1);
      OK(vkad_tape_set_checkpoint(tape, 3));
      OK(vkad_tape_keeps_intermediate_gradients(tape, &keeps));
      CHECK(keeps == 0);
      st = vkad_tape_keeps_intermediate_gradients(tape, NULL);
      CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
      vkad_status_free(st);
    }
    OK(vkad_tape_set_checkpoint(tape, 0));
    for (it = 0; it < 2; ++it) {
      OK(vkad_tape_reset(tape));
      launch_id = 0;
      OK(vkad_tape_launch(tape, &d, fargs, 4, &launch_id));
      CHECK(launch_id != 0);
      /* Checkpointing is set between recordings, not during one. */
      st = vkad_tape_set_checkpoint(tape, 2);
      CHECK(vkad_status_code(st) == VKAD_FAILED_PRECONDITION);
      CHECK(strstr(vkad_status_message(st), "launches are recorded") != NULL);
      vkad_status_free(st);
      st = vkad_tape_launch(tape, &d, fargs, 3, NULL); /* nothing launched or recorded */
      CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
      CHECK(strstr(vkad_status_message(st), "3 arguments given") != NULL);
      vkad_status_free(st);
      /* The same launch again overwrites `out`, which launch 0 wrote (differentiated): backward
       * would credit launch 0 with the gradient of the new values too. Refused, nothing
       * launched or recorded (api/tape_hazards.h). */
      st = vkad_tape_launch(tape, &d, fargs, 4, NULL);
      CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
      CHECK(strstr(vkad_status_message(st), "launch 1 ('sq') overwrites ndarray") != NULL);
      CHECK(strstr(vkad_status_message(st), "which launch 0 ('sq') wrote") != NULL);
      vkad_status_free(st);
      seed.array = other;
      seed.value = 1.0;
      seed.data = NULL;
      seed.bytes = 0;
      st = vkad_tape_backward(tape, &seed, 1);
      CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
      CHECK(strstr(vkad_status_message(st), "not a differentiated (grad) argument") != NULL);
      vkad_status_free(st);
      seed.array = ho;
      if (it == 1) { /* by host data the second time: the same gradient */
        seed.data = ones;
        seed.bytes = sizeof ones;
      }
      OK(vkad_tape_backward(tape, &seed, 1));
      g = 0;
      OK(vkad_tape_grad(tape, hx, &g));
      CHECK(g != 0 && g != hgx);
      OK(vkad_download(s, g, gx, sizeof gx));
      for (i = 0; i < N; ++i) {
        double ex = 2.0 * 1.5 * x[i] * y[i];
        if (fabs(gx[i] - ex) > 1e-5 * (1 + fabs(ex))) {
          fprintf(stderr, "c_api_test: tape gradient %d: got %g want %g\n", i, gx[i], ex);
          ++failures;
          break;
        }
      }
      memset(&stats, 0, sizeof stats);
      stats.struct_size = sizeof stats;
      OK(vkad_session_stats(s, &stats));
      if (it == 0) ndarrays_after_first = stats.ndarrays;
      CHECK(stats.ndarrays == ndarrays_after_first); /* nothing made after the first */
    }
    /* The caller's own gradient array replaces the tape's (which is freed). */
    OK(vkad_tape_set_grad(tape, hx, hgx));
    OK(vkad_tape_grad(tape, hx, &g));
    CHECK(g == hgx);
    g = 0;
    st = vkad_tape_grad(tape, other, &g);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(g == 0);
    vkad_status_free(st);
    vkad_tape_destroy(tape); /* frees the gradients it made: y's and out's */
    vkad_tape_destroy(NULL);
    OK(vkad_ndarray_free(s, other));
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    OK(vkad_session_stats(s, &stats));
    CHECK(stats.ndarrays == ndarrays_after_first - 4);
  }
  /* A differentiated scalar parameter on a tape (vkad_tape_scalar_grad): d sum(a x^2 y) / d a
   * = sum x^2 y, in a 1-element array. */
  {
    const char* scalar_grad =
        "kernel sqa(a: f32 grad, x: ndarray<f32, 1>, y: ndarray<f32, 1>, "
        "out: ndarray<f32, 1> grad) {\n"
        "  task main parallel %0 in [0, shape(x, 0)) {\n"
        "    %1 = load x[%0] : f32\n"
        "    %2 = load y[%0] : f32\n"
        "    %3 = arg a : f32\n"
        "    %4 = mul %3, %1 : f32\n"
        "    %5 = mul %4, %1 : f32\n"
        "    %6 = mul %5, %2 : f32\n"
        "    store out[%0], %6\n"
        "  }\n"
        "}\n";
    vkad_differentiated da;
    vkad_tape* tape = NULL;
    vkad_arg fargs[4];
    vkad_seed seed;
    vkad_ndarray g = 0;
    float ga = 0;
    double want = 0;
    memset(&da, 0, sizeof da);
    da.struct_size = sizeof da;
    OK(vkad_differentiate(s, scalar_grad, &da));
    fargs[0] = vkad_arg_f32(1.5f);
    fargs[1] = vkad_arg_ndarray(hx);
    fargs[2] = vkad_arg_ndarray(hy);
    fargs[3] = vkad_arg_ndarray(ho);
    OK(vkad_tape_create(s, &tape));
    OK(vkad_tape_launch(tape, &da, fargs, 4, NULL));
    seed.array = ho;
    seed.value = 1.0;
    seed.data = NULL;
    seed.bytes = 0;
    OK(vkad_tape_backward(tape, &seed, 1));
    OK(vkad_tape_scalar_grad(tape, &da, 0, &g));
    CHECK(g != 0);
    OK(vkad_download(s, g, &ga, sizeof ga));
    for (i = 0; i < N; ++i) want += (double)x[i] * x[i] * y[i];
    if (fabs(ga - want) > 1e-4 * (1 + fabs(want))) {
      fprintf(stderr, "c_api_test: scalar gradient: got %g want %g\n", ga, want);
      ++failures;
    }
    st = vkad_tape_scalar_grad(tape, &da, 1, &g); /* x: not a differentiated scalar */
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    vkad_tape_destroy(tape);
    OK(vkad_kernel_release(s, da.forward));
    OK(vkad_kernel_release(s, da.adjoint));
  }
  /* A captured launch replayed with its scalar replaced: out = 3 x^2 y, nothing ran at capture. */
  {
    vkad_graph g = 0;
    vkad_arg fargs[4];
    vkad_graph_update u;
    float out[N];
    uint64_t first = 0;
    fargs[0] = vkad_arg_f32(1.5f);
    fargs[1] = vkad_arg_ndarray(hx);
    fargs[2] = vkad_arg_ndarray(hy);
    fargs[3] = vkad_arg_ndarray(ho);
    OK(vkad_ndarray_zero(s, ho));
    OK(vkad_begin_capture(s, "c graph"));
    OK(vkad_launch(s, d.forward, fargs, 4, NULL));
    st = vkad_upload(s, hx, x, sizeof x);
    CHECK(vkad_status_code(st) == VKAD_FAILED_PRECONDITION);
    CHECK(strstr(vkad_status_message(st), "graph 'c graph' is being captured") != NULL);
    vkad_status_free(st);
    OK(vkad_end_capture(s, &g));
    CHECK(g != 0);
    OK(vkad_download(s, ho, out, sizeof out));
    CHECK(out[3] == 0.0f); /* captured, not run */
    u.launch = 0;
    u.param = 0;
    u.value = vkad_arg_f32(3.0f);
    OK(vkad_replay(s, g, &u, 1, &first));
    CHECK(first == 9); /* after the 2 launches, the tape's 4 and the scalar tape's 2 above */
    OK(vkad_download(s, ho, out, sizeof out));
    for (i = 0; i < N; ++i) {
      float want = 3.0f * x[i] * x[i] * y[i];
      if (fabs(out[i] - want) > 1e-6 * (1 + fabs(want))) {
        fprintf(stderr, "c_api_test: replay %d: got %g want %g\n", i, out[i], want);
        ++failures;
        break;
      }
    }
    u.launch = 1; /* the graph has one launch */
    st = vkad_replay(s, g, &u, 1, NULL);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    {
      /* Its launches' names, in the numbering updates take. */
      char name[8];
      size_t needed = 0;
      uint32_t count = 0, index = 7;
      OK(vkad_graph_launch_name(s, g, 0, &count, name, sizeof name, &needed));
      CHECK(count == 1 && needed == 3 && strcmp(name, "sq") == 0);
      st = vkad_graph_launch_name(s, g, 1, &count, name, sizeof name, NULL);
      CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
      CHECK(strstr(vkad_status_message(st), "past the graph's 1 launches") != NULL);
      vkad_status_free(st);
      st = vkad_graph_launch_name(s, g, 0, &count, name, 2, &needed);
      CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT && needed == 3);
      vkad_status_free(st);
      OK(vkad_graph_launch_index(s, g, "sq", &index));
      CHECK(index == 0);
      st = vkad_graph_launch_index(s, g, "sq#1", &index);
      CHECK(vkad_status_code(st) == VKAD_NOT_FOUND);
      CHECK(strstr(vkad_status_message(st), "'sq'") != NULL);
      vkad_status_free(st);
    }
    OK(vkad_graph_release(s, g));
    st = vkad_replay(s, g, NULL, 0, NULL);
    CHECK(vkad_status_code(st) == VKAD_NOT_FOUND);
    vkad_status_free(st);
    /* The same with the rework in the background: replayed before and after its install. */
    st = vkad_begin_capture_flags(s, "c graph", 4u);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    OK(vkad_begin_capture_flags(s, "c graph", VKAD_CAPTURE_BACKGROUND_REWORK));
    OK(vkad_launch(s, d.forward, fargs, 4, NULL));
    OK(vkad_end_capture(s, &g));
    u.launch = 0;
    u.value = vkad_arg_f32(2.0f);
    OK(vkad_replay(s, g, &u, 1, NULL));
    OK(vkad_graph_finish_rework(s, g));
    OK(vkad_ndarray_zero(s, ho));
    OK(vkad_replay(s, g, NULL, 0, NULL)); /* the update was kept */
    OK(vkad_download(s, ho, out, sizeof out));
    CHECK(fabs(out[3] - 2.0f * x[3] * x[3] * y[3]) <= 1e-6 * (1 + fabs(2.0f * x[3] * x[3] * y[3])));
    OK(vkad_graph_release(s, g));
    /* A capture that runs: the launch runs as it is captured, with no replay. */
    OK(vkad_ndarray_zero(s, ho));
    OK(vkad_begin_capture_flags(s, "c run", VKAD_CAPTURE_RUN | VKAD_CAPTURE_BACKGROUND_REWORK));
    OK(vkad_launch(s, d.forward, fargs, 4, NULL));
    OK(vkad_end_capture(s, &g));
    OK(vkad_download(s, ho, out, sizeof out));
    CHECK(fabs(out[3] - 1.5f * x[3] * x[3] * y[3]) <= 1e-6 * (1 + fabs(1.5f * x[3] * x[3] * y[3])));
    OK(vkad_graph_release(s, g));
    /* Captures that run, each after the last one's replay and release with nothing waited for
     * in between (they failed with VKAD_INTERNAL "side bundles still in flight" before). */
    for (i = 0; i < 6; ++i) {
      OK(vkad_begin_capture_flags(s, "c run loop", VKAD_CAPTURE_RUN));
      OK(vkad_launch(s, d.forward, fargs, 4, NULL));
      OK(vkad_end_capture(s, &g));
      OK(vkad_ndarray_zero(s, ho));
      OK(vkad_replay(s, g, NULL, 0, NULL));
      OK(vkad_graph_release(s, g));
    }
    OK(vkad_download(s, ho, out, sizeof out));
    CHECK(fabs(out[3] - 1.5f * x[3] * x[3] * y[3]) <= 1e-6 * (1 + fabs(1.5f * x[3] * x[3] * y[3])));
  }
  /* Wrong size, freed handles: errors naming what is wrong. */
  st = vkad_download(s, hgx, gx, 4);
  CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
  CHECK(strstr(vkad_status_message(st), "x_grad") != NULL);
  vkad_status_free(st);
  OK(vkad_ndarray_free(s, hy));
  st = vkad_ndarray_zero(s, hy);
  CHECK(vkad_status_code(st) == VKAD_NOT_FOUND);
  vkad_status_free(st);
  OK(vkad_synchronize(s));

  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  OK(vkad_session_stats(s, &stats));
  /* 2, the tape's 2 forwards and 2 adjoints, the scalar tape's forward and adjoint, 3 replayed,
   * 1 run, then 6 runs and 6 replays */
  CHECK(stats.launches == 24);
  CHECK(stats.dispatches >= stats.launches); /* a dispatch per task */
  CHECK(stats.barriers > 0 && stats.barriers <= stats.dispatches); /* eager: one after each */
  CHECK(stats.ndarrays == 5);
  CHECK(stats.memory_used_bytes > 0);
  /* The peaks hold at least what is held now; a reset starts them from it. */
  CHECK(stats.memory_peak_used_bytes >= stats.memory_used_bytes);
  CHECK(stats.memory_peak_block_bytes >= stats.memory_block_bytes);
  OK(vkad_reset_memory_peaks(s));
  OK(vkad_session_stats(s, &stats));
  CHECK(stats.memory_peak_used_bytes == stats.memory_used_bytes);
  CHECK(stats.memory_peak_block_bytes == stats.memory_block_bytes);
  CHECK(stats.vulkan_objects_created > 0); /* the device's own objects at least */
  CHECK(stats.kernels_compiled >= 2);
  CHECK(stats.disk_cache_hits == 0 && stats.disk_cache_misses == 0); /* caches off */
  CHECK(stats.pipeline_cache_loaded == 0);
  /* The user's memory (5 live arrays) apart from the runtime's own (the args ring at least). */
  CHECK(stats.user_bytes > 0 && stats.user_bytes <= stats.memory_used_bytes);
  CHECK(stats.args_ring_bytes > 0 && stats.runtime_bytes >= stats.args_ring_bytes);
  /* Idle runtime memory back to the driver: the rings and pools are empty afterwards, the
   * user's arrays stay. */
  /* A timeline: two fills timed on the device (where it has timestamp queries), the summary
   * truncated to the buffer, misuse refused. */
  {
    char summary[16];
    size_t needed = 0;
    uint64_t events = 0;
    st = vkad_timeline_end(s, NULL, NULL, 0, NULL, NULL);
    CHECK(vkad_status_code(st) == VKAD_FAILED_PRECONDITION);
    CHECK(strstr(vkad_status_message(st), "no timeline") != NULL);
    vkad_status_free(st);
    OK(vkad_timeline_begin_sampled(s, 0, 1)); /* every graph replay timed launch by launch */
    st = vkad_timeline_begin(s, 0);
    CHECK(vkad_status_code(st) == VKAD_FAILED_PRECONDITION);
    vkad_status_free(st);
    OK(vkad_ndarray_fill(s, hgx, 0.5));
    OK(vkad_ndarray_fill(s, hgy, 0.25));
    OK(vkad_synchronize(s));
    OK(vkad_timeline_end(s, NULL, summary, sizeof summary, &needed, &events));
    CHECK(strlen(summary) == sizeof summary - 1 && needed > sizeof summary);
    CHECK(strncmp(summary, "name", 4) == 0);
    CHECK(events >= 2); /* the submission and the wait at least; the fills with timestamps */
  }
  /* Kernel prints into a sink of the caller's; NULL gives stdout back. */
  {
    vkad_kernel pr = 0;
    vkad_arg parg;
    int lines = 0;
    OK(vkad_compile(s,
                    "kernel pr(x: ndarray<f32, 1>) {\n"
                    "  task main parallel %0 in [0, 2) {\n"
                    "    %1 = load x[%0] : f32\n    print \"x[{}] = {}\", %0, %1\n"
                    "  }\n}\n",
                    &pr));
    st = vkad_session_set_print_sink(NULL, on_print, &lines);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    OK(vkad_session_set_print_sink(s, on_print, &lines));
    OK(vkad_ndarray_fill(s, hgx, 0.5));
    parg = vkad_arg_ndarray(hgx);
    OK(vkad_launch(s, pr, &parg, 1, NULL));
    OK(vkad_synchronize(s));
    CHECK(lines == 2);
    /* Two invocations: in either order, each with its line prefix. */
    CHECK(strstr(printed, "x[0] = 0.5") != NULL && strstr(printed, "x[1] = 0.5") != NULL);
    CHECK(strstr(printed, "[kernel 'pr'") != NULL);
    OK(vkad_session_set_print_sink(s, NULL, NULL));
    OK(vkad_kernel_release(s, pr));
  }
  /* The NaN / infinity checks: a second session with check_finite, log(0) stored. */
  {
    vkad_session* checked = NULL;
    vkad_session_options co = opts;
    vkad_kernel lg = 0;
    vkad_ndarray cx = 0, cy = 0;
    vkad_arg cargs[2];
    float cv[4] = {1.0f, 0.0f, 2.0f, 3.0f};
    uint32_t cshape[1] = {4};
    co.check_finite = 1;
    OK(vkad_session_create(&co, &checked));
    OK(vkad_compile(checked,
                    "kernel lg(x: ndarray<f32, 1>, y: ndarray<f32, 1>) {\n"
                    "  task main parallel %0 in [0, shape(x, 0)) {\n"
                    "    %1 = load x[%0] : f32\n    %2 = log %1 : f32\n    store y[%0], %2\n"
                    "  }\n}\n",
                    &lg));
    OK(vkad_ndarray_create(checked, VKAD_F32, 1, cshape, "x", &cx));
    OK(vkad_ndarray_create(checked, VKAD_F32, 1, cshape, "y", &cy));
    OK(vkad_upload(checked, cx, cv, sizeof cv));
    cargs[0] = vkad_arg_ndarray(cx);
    cargs[1] = vkad_arg_ndarray(cy);
    OK(vkad_launch(checked, lg, cargs, 2, NULL));
    st = vkad_synchronize(checked);
    CHECK(vkad_status_code(st) == VKAD_DEVICE_ERROR);
    CHECK(strstr(vkad_status_message(st), "a NaN or an infinity was stored by `store y[") != NULL);
    vkad_status_free(st);
    vkad_session_destroy(checked);
  }
  OK(vkad_release_idle_memory(s));
  {
    vkad_stats idle;
    memset(&idle, 0, sizeof idle);
    idle.struct_size = sizeof idle;
    OK(vkad_session_stats(s, &idle));
    CHECK(idle.runtime_bytes == 0 && idle.args_ring_bytes == 0 && idle.spare_block_bytes == 0);
    CHECK(idle.user_bytes == stats.user_bytes && idle.ndarrays == 5);
    CHECK(idle.live_buffers < stats.live_buffers);
  }

  /* A dtype outside vkad_dtype (a C caller may store any int in the enum): a named error. */
  {
    vkad_ndarray bad = 0;
    vkad_dtype wild;
    vkad_arg arg = vkad_arg_f32(1.0f);
    int raw = 99;
    memcpy(&wild, &raw, sizeof wild);
    st = vkad_ndarray_create(s, wild, 1, shape, "bad", &bad);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "dtype 99 is not a vkad_dtype") != NULL);
    CHECK(bad == 0);
    vkad_status_free(st);
    raw = -1;
    memcpy(&arg.dtype, &raw, sizeof arg.dtype);
    st = vkad_launch(s, d.forward, &arg, 1, NULL);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "argument 0: dtype -1 is not a vkad_dtype") != NULL);
    vkad_status_free(st);
  }
  /* A fill value the dtype cannot hold: refused, naming the array (Runtime::fill). */
  {
    vkad_ndarray ints = 0;
    OK(vkad_ndarray_create(s, VKAD_I32, 1, shape, "ints", &ints));
    st = vkad_ndarray_fill(s, ints, 1e20);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "fill 'ints': value 1e+20 does not fit i32") != NULL);
    vkad_status_free(st);
    st = vkad_ndarray_fill(s, hgx, 1e300);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    OK(vkad_ndarray_free(s, ints));
  }

  step_loop(s, 1);

  /* The session options reach the graph passes: resident loops off (-1) or capped below the
   * loop's 16 elements (8) run the loop launch by launch, with the same results; values out of
   * range are refused, naming the field. */
  {
    vkad_session* s2 = NULL;
    int32_t caps[2] = {-1, 8};
    int c;
    opts.fuse_graph_launches = 2;
    st = vkad_session_create(&opts, &s2);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "fuse_graph_launches 2") != NULL);
    CHECK(s2 == NULL);
    vkad_status_free(st);
    opts.fuse_graph_launches = -1;
    opts.block_stencils = -2;
    st = vkad_session_create(&opts, &s2);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "block_stencils -2") != NULL);
    CHECK(s2 == NULL);
    vkad_status_free(st);
    opts.block_stencils = -1;
    opts.schedule_graph_launches = -1;
    opts.resident_max_range = -2;
    st = vkad_session_create(&opts, &s2);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "resident_max_range -2") != NULL);
    vkad_status_free(st);
    for (c = 0; c < 2; ++c) {
      opts.resident_max_range = caps[c];
      OK(vkad_session_create(&opts, &s2));
      step_loop(s2, 0);
      vkad_session_destroy(s2);
      s2 = NULL;
    }
    /* The graph passes as text: one out of order is refused, naming it; "none" is no pass. */
    opts.fuse_graph_launches = 0;
    opts.schedule_graph_launches = 0;
    opts.resident_max_range = 0;
    opts.graph_passes = "fuse, schedule";
    st = vkad_session_create(&opts, &s2);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    CHECK(strstr(vkad_status_message(st), "'schedule' must come before 'fuse'") != NULL);
    CHECK(s2 == NULL);
    vkad_status_free(st);
    opts.graph_passes = "none";
    OK(vkad_session_create(&opts, &s2));
    step_loop(s2, 0);
    vkad_session_destroy(s2);
    s2 = NULL;
    opts.graph_passes = NULL;
  }

  {
    /* A memory budget: checkpointing on, a schedule only once something is recorded. */
    vkad_tape* tape = NULL;
    vkad_checkpoint_plan plan;
    vkad_ndarray arrays[3];
    vkad_arg args[4];
    int keeps = -1, i;
    for (i = 0; i < 3; ++i) OK(vkad_ndarray_create(s, VKAD_F32, 1, shape, "budget", &arrays[i]));
    args[0] = vkad_arg_f32(1.5f);
    for (i = 0; i < 3; ++i) args[i + 1] = vkad_arg_ndarray(arrays[i]);
    OK(vkad_tape_create(s, &tape));
    OK(vkad_tape_set_memory_budget(tape, 1 << 20));
    OK(vkad_tape_keeps_intermediate_gradients(tape, &keeps));
    CHECK(keeps == 0);
    plan.struct_size = sizeof plan;
    st = vkad_tape_checkpoint_plan(tape, &plan);
    CHECK(vkad_status_code(st) == VKAD_FAILED_PRECONDITION);
    CHECK(strstr(vkad_status_message(st), "nothing is recorded") != NULL);
    vkad_status_free(st);
    OK(vkad_tape_fill(tape, arrays[2], 0.0)); /* untouched yet: a plain fill, not recorded */
    OK(vkad_tape_launch(tape, &d, args, 4, NULL));
    OK(vkad_tape_fill(tape, arrays[2], 0.0)); /* recorded: a launch was passed it */
    OK(vkad_tape_checkpoint_plan(tape, &plan));
    CHECK(plan.launches == 2 && plan.levels >= 2 && plan.segments[plan.levels - 1] == 1);
    CHECK(plan.peak_bytes > 0 && plan.peak_bytes <= (1 << 20) && plan.min_bytes <= plan.peak_bytes);
    st = vkad_tape_checkpoint_plan(tape, NULL);
    CHECK(vkad_status_code(st) == VKAD_INVALID_ARGUMENT);
    vkad_status_free(st);
    vkad_tape_destroy(tape);
    for (i = 0; i < 3; ++i) OK(vkad_ndarray_free(s, arrays[i]));
  }

  OK(vkad_kernel_release(s, d.forward));
  OK(vkad_kernel_release(s, d.adjoint));
  vkad_session_destroy(s);
  vkad_set_log_callback(NULL, NULL);
  CHECK(log_calls == 0); /* validation on, and nothing to report */
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
