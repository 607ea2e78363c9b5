/* The range reader's hot path in C: one confluent-kafka Consumer's consume, straight into Arrow
 * column buffers, with no Python object per record (fanout_sink/kafka/native_consume.py wraps it).
 *
 * Why this shape:
 * - It consumes on the confluent-kafka Consumer the RangeReader already has (its rd_kafka_t), so
 *   assignment, pause/resume, seek, watermarks, close, the logger and error_cb all stay
 *   confluent-kafka's; only consume() is replaced. That needs confluent-kafka's C handle layout
 *   (src/confluent_kafka/src/confluent_kafka.h, `Handle` and `CallState`), mirrored below for the
 *   versions native_consume.py accepts, and checked on every consumer (check()).
 * - No link-time dependency and no rdkafka.h: the librdkafka functions below are resolved with
 *   dlsym on the librdkafka confluent-kafka already loaded (bind()); rd_kafka_message_t is
 *   librdkafka's public ABI. Building needs a C compiler and Python.h only.
 * - While librdkafka waits, the GIL is released and the handle's thread-local CallState is set as
 *   confluent-kafka's own consume() does, so the logger and error_cb it serves from the consumer
 *   queue run as they would there; an exception one raises is raised here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ---- librdkafka's public ABI (rdkafka.h, 1.x and 2.x) ---- */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;

typedef struct {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

#define RD_KAFKA_CONSUMER 1

static struct {
    ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
    void (*message_destroy)(rd_kafka_message_t *);
    int64_t (*message_timestamp)(const rd_kafka_message_t *, int *);
    int (*message_headers)(const rd_kafka_message_t *, rd_kafka_headers_t **);
    size_t (*header_cnt)(const rd_kafka_headers_t *);
    int (*header_get_all)(const rd_kafka_headers_t *, size_t, const char **, const void **, size_t *);
    const char *(*topic_name)(const rd_kafka_topic_t *);
    const char *(*err2str)(int);
    int (*last_error)(void);
    int (*type)(const rd_kafka_t *);
    void *(*opaque)(const rd_kafka_t *);
    rd_kafka_queue_t *(*queue_get_consumer)(rd_kafka_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    const char *(*version_str)(void);
} rk;

static int bound = 0;

/* ---- confluent-kafka's C handle (2.16.x), as far as it is used here ---- */
typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    PyObject *error_cb, *throttle_cb, *stats_cb;
    int initiated;
    Py_tss_t tlskey; /* the thread's CallState while a call waits in librdkafka */
    int type;        /* rd_kafka_type_t */
    PyObject *logger, *oauth_cb;
    int oauth_token_set, active_calls, closing;
    unsigned long closing_thread;
    /* union u, its Consumer member (the largest) */
    int rebalance_assigned, rebalance_incremental_assigned, rebalance_incremental_unassigned;
    PyObject *on_assign, *on_revoke, *on_lost, *on_commit;
    rd_kafka_queue_t *rkqu;
    unsigned long gate_owner; /* one caller at a time inside the Consumer's C code */
    int gate_depth;
} Handle;

typedef struct {
    PyThreadState *thread_state;
    int crashed;
    PyObject *exception_value;
} CallState;

static PyObject *bind(PyObject *module, PyObject *arg) {
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL) return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) return PyErr_Format(PyExc_ImportError, "%s is not loaded in this process", path);
#define SYM(field, name)                                                                             \
    if ((*(void **)&rk.field = dlsym(lib, name)) == NULL) {                                         \
        dlclose(lib);                                                                                \
        return PyErr_Format(PyExc_ImportError, "%s has no %s", path, name);                         \
    }
    SYM(consume_batch_queue, "rd_kafka_consume_batch_queue")
    SYM(message_destroy, "rd_kafka_message_destroy")
    SYM(message_timestamp, "rd_kafka_message_timestamp")
    SYM(message_headers, "rd_kafka_message_headers")
    SYM(header_cnt, "rd_kafka_header_cnt")
    SYM(header_get_all, "rd_kafka_header_get_all")
    SYM(topic_name, "rd_kafka_topic_name")
    SYM(err2str, "rd_kafka_err2str")
    SYM(last_error, "rd_kafka_last_error")
    SYM(type, "rd_kafka_type")
    SYM(opaque, "rd_kafka_opaque")
    SYM(queue_get_consumer, "rd_kafka_queue_get_consumer")
    SYM(queue_destroy, "rd_kafka_queue_destroy")
    SYM(version_str, "rd_kafka_version_str")
#undef SYM
    bound = 1; /* the handle stays open: librdkafka stays loaded for confluent-kafka anyway */
    return PyUnicode_FromString(rk.version_str());
}

/* The consumer as confluent-kafka's handle, or NULL with the reason raised. */
static Handle *handle_of(PyObject *consumer) {
    if (!bound) return (Handle *)PyErr_Format(PyExc_RuntimeError, "bind() the loaded librdkafka first");
    PyTypeObject *type = Py_TYPE(consumer);
    int is_consumer = 0;
    for (PyTypeObject *t = type; t != NULL; t = t->tp_base)
        if (strcmp(t->tp_name, "cimpl.Consumer") == 0) is_consumer = 1;
    if (!is_consumer)
        return (Handle *)PyErr_Format(PyExc_TypeError, "%s is not a confluent_kafka.Consumer", type->tp_name);
    if (type->tp_basicsize < (Py_ssize_t)sizeof(Handle))
        return (Handle *)PyErr_Format(PyExc_RuntimeError,
                                      "confluent-kafka's Consumer is %zd bytes, not the %zu this was built for",
                                      type->tp_basicsize, sizeof(Handle));
    Handle *h = (Handle *)consumer;
    if (h->rk == NULL) return (Handle *)PyErr_Format(PyExc_RuntimeError, "Consumer closed");
    return h;
}

static PyObject *check(PyObject *module, PyObject *consumer) {
    Handle *h = handle_of(consumer);
    if (h == NULL) return NULL;
    if (rk.opaque(h->rk) != (void *)h || rk.type(h->rk) != RD_KAFKA_CONSUMER || h->type != RD_KAFKA_CONSUMER ||
        !PyThread_tss_is_created(&h->tlskey))
        return PyErr_Format(PyExc_RuntimeError, "confluent-kafka's Consumer is not laid out as this was built for");
    Py_RETURN_NONE;
}

/* confluent-kafka's serializing gate (Handle_serialize_enter): one caller at a time. */
static int gate_enter(Handle *h) {
    unsigned long me = PyThread_get_thread_ident();
    for (;;) {
        unsigned long owner = __atomic_load_n(&h->gate_owner, __ATOMIC_SEQ_CST), free_ = 0;
        if (owner == me) {
            __atomic_add_fetch(&h->gate_depth, 1, __ATOMIC_SEQ_CST);
            return 1;
        }
        if (owner == 0 &&
            __atomic_compare_exchange_n(&h->gate_owner, &free_, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&h->gate_depth, 1, __ATOMIC_SEQ_CST);
            return 1;
        }
        Py_BEGIN_ALLOW_THREADS
        usleep(1000);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0) return 0;
    }
}

static void gate_exit(Handle *h) {
    if (__atomic_sub_fetch(&h->gate_depth, 1, __ATOMIC_SEQ_CST) == 0)
        __atomic_store_n(&h->gate_owner, 0, __ATOMIC_SEQ_CST);
}

/* An exception a callback raised while librdkafka waited, as the current one. */
static void restore_callback_exception(CallState *cs) {
    if (cs->exception_value != NULL) {
#if PY_VERSION_HEX >= 0x030c0000
        PyErr_SetRaisedException(cs->exception_value);
#else
        /* PyErr_Fetch's value, not always normalised: for `1/0` in the callback, the message. */
        if (PyExceptionInstance_Check(cs->exception_value))
            PyErr_SetObject(PyExceptionInstance_Class(cs->exception_value), cs->exception_value);
        else
            PyErr_Format(PyExc_RuntimeError, "a confluent-kafka callback failed in consume: %S",
                         cs->exception_value);
        Py_DECREF(cs->exception_value);
#endif
        cs->exception_value = NULL;
    }
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "a confluent-kafka callback failed in consume");
}

static void destroy_all(rd_kafka_message_t **m, size_t n) {
    for (size_t i = 0; i < n; i++) rk.message_destroy(m[i]);
}

static PyObject *new_bytes(size_t size, char **data) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (b != NULL) *data = PyBytes_AS_STRING(b);
    return b;
}

/* An Arrow validity bitmap (LSB first) of n bits, all set; the caller clears the nulls. */
static PyObject *new_bitmap(size_t n, uint8_t **bits) {
    char *data;
    PyObject *b = new_bytes((n + 7) / 8, &data);
    if (b != NULL) {
        memset(data, 0xff, (n + 7) / 8);
        *bits = (uint8_t *)data;
    }
    return b;
}

#define CLEAR_BIT(bits, i) ((bits)[(i) >> 3] &= (uint8_t) ~(1u << ((i)&7)))
#define COLUMN_LIMIT ((size_t)INT32_MAX) /* Arrow binary/string: int32 offsets */

/* One binary column (key or value) of records m[0..n): (validity or None, nulls, offsets, data). */
static PyObject *binary_column(rd_kafka_message_t **m, size_t n, int keys) {
    size_t total = 0, nulls = 0;
    for (size_t i = 0; i < n; i++) {
        if ((keys ? m[i]->key : m[i]->payload) == NULL) nulls++;
        else total += keys ? m[i]->key_len : m[i]->len;
    }
    char *offsets_data = NULL, *data = NULL;
    uint8_t *bits = NULL;
    PyObject *valid = nulls ? new_bitmap(n, &bits) : Py_NewRef(Py_None);
    PyObject *offsets = new_bytes((n + 1) * 4, &offsets_data);
    PyObject *values = new_bytes(total, &data);
    if (valid == NULL || offsets == NULL || values == NULL) {
        Py_XDECREF(valid);
        Py_XDECREF(offsets);
        Py_XDECREF(values);
        return NULL;
    }
    int32_t *at = (int32_t *)offsets_data, end = 0;
    for (size_t i = 0; i < n; i++) {
        const void *p = keys ? m[i]->key : m[i]->payload;
        at[i] = end;
        if (p == NULL) {
            CLEAR_BIT(bits, i);
            continue;
        }
        size_t len = keys ? m[i]->key_len : m[i]->len;
        memcpy(data + end, p, len);
        end += (int32_t)len;
    }
    at[n] = end;
    return Py_BuildValue("(NnNN)", valid, (Py_ssize_t)nulls, offsets, values);
}

/* Header entries and bytes of one record (0 without headers); its headers in *h (NULL: none). */
static void header_sizes(rd_kafka_message_t *m, rd_kafka_headers_t **h, size_t *entries, size_t *names,
                         size_t *values) {
    *entries = *names = *values = 0;
    if (rk.message_headers(m, h) != 0) {
        *h = NULL;
        return;
    }
    size_t count = rk.header_cnt(*h);
    for (size_t j = 0; j < count; j++) {
        const char *name;
        const void *value;
        size_t size;
        if (rk.header_get_all(*h, j, &name, &value, &size) != 0) continue;
        (*entries)++;
        *names += strlen(name);
        if (value != NULL) *values += size;
    }
}

/* The headers column's buffers, or None when no record of m[0..n) has a header:
 * (list validity or None, list nulls, list offsets, name offsets, names, value validity or None,
 *  value nulls, value offsets, values). hdrs[i] is record i's headers (NULL: none), as
 * header_sizes() found them; a record without headers is null, as confluent-kafka's
 * Message.headers() gives None for it. */
static PyObject *headers_column(rd_kafka_headers_t **hdrs, size_t n) {
    size_t count = 0, names = 0, values = 0, value_nulls = 0, without = 0;
    for (size_t i = 0; i < n; i++) {
        if (hdrs[i] == NULL) {
            without++;
            continue;
        }
        size_t c = rk.header_cnt(hdrs[i]);
        for (size_t j = 0; j < c; j++) {
            const char *name;
            const void *value;
            size_t size;
            if (rk.header_get_all(hdrs[i], j, &name, &value, &size) != 0) continue;
            count++;
            names += strlen(name);
            if (value == NULL) value_nulls++;
            else values += size;
        }
    }
    if (count == 0) Py_RETURN_NONE;
    char *lo_c = NULL, *no_c = NULL, *nd = NULL, *vo_c = NULL, *vd = NULL;
    uint8_t *lbits = NULL, *vbits = NULL;
    PyObject *lvalid = without ? new_bitmap(n, &lbits) : Py_NewRef(Py_None);
    PyObject *loffs = new_bytes((n + 1) * 4, &lo_c);
    PyObject *noffs = new_bytes((count + 1) * 4, &no_c);
    PyObject *nbytes = new_bytes(names, &nd);
    PyObject *vvalid = value_nulls ? new_bitmap(count, &vbits) : Py_NewRef(Py_None);
    PyObject *voffs = new_bytes((count + 1) * 4, &vo_c);
    PyObject *vbytes = new_bytes(values, &vd);
    if (!lvalid || !loffs || !noffs || !nbytes || !vvalid || !voffs || !vbytes) {
        Py_XDECREF(lvalid);
        Py_XDECREF(loffs);
        Py_XDECREF(noffs);
        Py_XDECREF(nbytes);
        Py_XDECREF(vvalid);
        Py_XDECREF(voffs);
        Py_XDECREF(vbytes);
        return NULL;
    }
    int32_t *lo = (int32_t *)lo_c, *no = (int32_t *)no_c, *vo = (int32_t *)vo_c;
    int32_t k = 0, nat = 0, vat = 0;
    for (size_t i = 0; i < n; i++) {
        lo[i] = k;
        if (hdrs[i] == NULL) {
            CLEAR_BIT(lbits, i);
            continue;
        }
        size_t c = rk.header_cnt(hdrs[i]);
        for (size_t j = 0; j < c; j++) {
            const char *name;
            const void *value;
            size_t size;
            if (rk.header_get_all(hdrs[i], j, &name, &value, &size) != 0) continue;
            size_t nl = strlen(name);
            no[k] = nat;
            vo[k] = vat;
            memcpy(nd + nat, name, nl);
            nat += (int32_t)nl;
            if (value == NULL) CLEAR_BIT(vbits, k);
            else {
                memcpy(vd + vat, value, size);
                vat += (int32_t)size;
            }
            k++;
        }
    }
    lo[n] = k;
    no[k] = nat;
    vo[k] = vat;
    return Py_BuildValue("(NnNNNNnNN)", lvalid, (Py_ssize_t)without, loffs, noffs, nbytes, vvalid,
                         (Py_ssize_t)value_nulls, voffs, vbytes);
}

/* Runs of records m[0..n) of one partition each: [(topic, partition, first row, rows)]. */
static PyObject *runs_of(rd_kafka_message_t **m, size_t n) {
    PyObject *runs = PyList_New(0);
    size_t first = 0;
    for (size_t i = 1; runs != NULL && i <= n; i++) {
        if (i < n && m[i]->rkt == m[first]->rkt && m[i]->partition == m[first]->partition) continue;
        PyObject *run = Py_BuildValue("(sinn)", rk.topic_name(m[first]->rkt), (int)m[first]->partition,
                                      (Py_ssize_t)first, (Py_ssize_t)(i - first));
        if (run == NULL || PyList_Append(runs, run) < 0) Py_CLEAR(runs);
        Py_XDECREF(run);
        first = i;
    }
    return runs;
}

/* One segment of records m[0..n): (rows, runs, key, value, offsets, timestamps, types, headers);
 * timestamps in microseconds and types as Spark's (librdkafka's minus one), as RangeReader had them. */
static PyObject *segment(rd_kafka_message_t **m, rd_kafka_headers_t **hdrs, size_t n) {
    char *o_c = NULL, *s_c = NULL, *k_c = NULL;
    PyObject *runs = runs_of(m, n);
    PyObject *key = runs ? binary_column(m, n, 1) : NULL;
    PyObject *value = key ? binary_column(m, n, 0) : NULL;
    PyObject *offsets = value ? new_bytes(n * 8, &o_c) : NULL;
    PyObject *stamps = offsets ? new_bytes(n * 8, &s_c) : NULL;
    PyObject *kinds = stamps ? new_bytes(n * 4, &k_c) : NULL;
    PyObject *headers = kinds ? headers_column(hdrs, n) : NULL;
    if (headers == NULL) {
        Py_XDECREF(runs);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(offsets);
        Py_XDECREF(stamps);
        Py_XDECREF(kinds);
        return NULL;
    }
    int64_t *o = (int64_t *)o_c, *s = (int64_t *)s_c;
    int32_t *k = (int32_t *)k_c;
    for (size_t i = 0; i < n; i++) {
        int tstype = 0;
        o[i] = m[i]->offset;
        s[i] = rk.message_timestamp(m[i], &tstype) * 1000;
        k[i] = tstype - 1;
    }
    return Py_BuildValue("(nNNNNNNN)", (Py_ssize_t)n, runs, key, value, offsets, stamps, kinds, headers);
}

/* Records m[0..n) cut into segments whose keys, values and headers each fit Arrow's int32 offsets. */
static PyObject *segments_of(rd_kafka_message_t **m, size_t n) {
    PyObject *segments = PyList_New(0);
    rd_kafka_headers_t **hdrs = PyMem_Malloc((n ? n : 1) * sizeof *hdrs);
    if (segments == NULL || hdrs == NULL) {
        Py_XDECREF(segments);
        PyMem_Free(hdrs);
        return PyErr_NoMemory();
    }
    size_t first = 0, keys = 0, values = 0, names = 0, hvalues = 0, entries = 0;
    for (size_t i = 0; i <= n && segments != NULL; i++) {
        size_t kl = 0, vl = 0, e = 0, nb = 0, vb = 0;
        if (i < n) {
            kl = m[i]->key ? m[i]->key_len : 0;
            vl = m[i]->payload ? m[i]->len : 0;
            header_sizes(m[i], &hdrs[i], &e, &nb, &vb);
            if (kl > COLUMN_LIMIT || vl > COLUMN_LIMIT || nb > COLUMN_LIMIT || vb > COLUMN_LIMIT) {
                Py_CLEAR(segments);
                PyErr_Format(PyExc_ValueError, "a record of %zu bytes is larger than an Arrow binary column holds",
                             kl + vl + vb);
                break;
            }
        }
        int fits = keys + kl <= COLUMN_LIMIT && values + vl <= COLUMN_LIMIT && names + nb <= COLUMN_LIMIT &&
                   hvalues + vb <= COLUMN_LIMIT && entries + e <= COLUMN_LIMIT;
        if (i < n && fits) {
            keys += kl, values += vl, names += nb, hvalues += vb, entries += e;
            continue;
        }
        if (i > first) {
            PyObject *seg = segment(m + first, hdrs + first, i - first);
            if (seg == NULL || PyList_Append(segments, seg) < 0) Py_CLEAR(segments);
            Py_XDECREF(seg);
        }
        first = i;
        keys = kl, values = vl, names = nb, hvalues = vb, entries = e;
    }
    PyMem_Free(hdrs);
    return segments;
}

/* consume(consumer, max_messages, timeout_ms) -> (segments, events): what confluent-kafka's
 * Consumer.consume(max_messages, timeout_ms / 1000) would return, as column buffers (segments, see
 * segment()) and the non-record events [(topic or None, partition, offset, error code, text)]
 * (partition EOFs and errors). */
static PyObject *consume(PyObject *module, PyObject *args) {
    PyObject *consumer;
    Py_ssize_t max_messages;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "Oni", &consumer, &max_messages, &timeout_ms)) return NULL;
    if (max_messages < 1 || max_messages > 1000000)
        return PyErr_Format(PyExc_ValueError, "max_messages must be 1 to 1000000, not %zd", max_messages);
    Handle *h = handle_of(consumer);
    if (h == NULL || !gate_enter(h)) return NULL;
    PyObject *result = NULL, *events = NULL, *segments = NULL;
    rd_kafka_message_t **m = PyMem_Malloc((size_t)max_messages * sizeof *m);
    rd_kafka_queue_t *queue = h->rk ? rk.queue_get_consumer(h->rk) : NULL;
    if (m == NULL || queue == NULL) {
        if (m == NULL) PyErr_NoMemory();
        else PyErr_SetString(PyExc_RuntimeError, h->rk ? "the consumer has no consumer queue" : "Consumer closed");
        goto done;
    }
    CallState cs = {NULL, 0, NULL};
    cs.thread_state = PyEval_SaveThread();
    PyThread_tss_set(&h->tlskey, &cs);
    ssize_t got = rk.consume_batch_queue(queue, timeout_ms, m, (size_t)max_messages);
    int failure = got < 0 ? rk.last_error() : 0;
    PyThread_tss_set(&h->tlskey, NULL);
    PyEval_RestoreThread(cs.thread_state);
    size_t n = got < 0 ? 0 : (size_t)got;
    if (cs.crashed || PyErr_CheckSignals() < 0) {
        if (cs.crashed) restore_callback_exception(&cs);
        destroy_all(m, n);
        goto done;
    }
    if (got < 0) {
        PyErr_Format(PyExc_RuntimeError, "rd_kafka_consume_batch_queue failed: %s", rk.err2str(failure));
        goto done;
    }
    /* Events out, records compacted in place (their order kept). */
    events = PyList_New(0);
    size_t records = 0;
    for (size_t i = 0; i < n; i++) {
        if (m[i]->err == 0) {
            m[records++] = m[i];
            continue;
        }
        if (events != NULL) {
            const char *topic = m[i]->rkt ? rk.topic_name(m[i]->rkt) : NULL;
            PyObject *event = Py_BuildValue("(ziLis)", topic, (int)m[i]->partition, (long long)m[i]->offset,
                                            m[i]->err, rk.err2str(m[i]->err));
            if (event == NULL || PyList_Append(events, event) < 0) Py_CLEAR(events);
            Py_XDECREF(event);
        }
        rk.message_destroy(m[i]);
    }
    segments = events ? segments_of(m, records) : NULL;
    destroy_all(m, records);
    if (segments != NULL) result = PyTuple_Pack(2, segments, events);
done:
    Py_XDECREF(segments);
    Py_XDECREF(events);
    if (queue != NULL) rk.queue_destroy(queue);
    PyMem_Free(m);
    gate_exit(h);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(path): resolve librdkafka's functions in the loaded library; its version"},
    {"check", check, METH_O, "check(consumer): raise unless it is a confluent-kafka Consumer laid out as expected"},
    {"consume", consume, METH_VARARGS, "consume(consumer, max_messages, timeout_ms) -> (segments, events)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "librdkafka_arrow", NULL, -1, methods};

PyMODINIT_FUNC PyInit_librdkafka_arrow(void) { return PyModule_Create(&module); }
