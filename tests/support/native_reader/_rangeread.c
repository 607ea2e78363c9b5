/* A measurement prototype (issue 34 item 1): one partition's offset range [start, end) read with
 * librdkafka's rd_kafka_consume_batch_queue straight into Arrow-layout column buffers, no Python
 * object per record. Built and loaded by tests/support/native_reader/__init__.py against the
 * librdkafka that confluent-kafka's wheel bundles (no rdkafka.h needed: the few declarations it
 * uses are below, from librdkafka 2.x's public header).
 *
 * Semantics follow fanout_sink/kafka/range_reader.py's RangeReader (one range assigned alone):
 * read_committed, so markers and aborted records never arrive and the range ends at the first
 * record at or past `end`, or at a partition EOF at or past `end`. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ---- librdkafka declarations (ABI of rdkafka.h, 2.x) ---- */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct rd_kafka_topic_partition_list_s rd_kafka_topic_partition_list_t;
typedef int rd_kafka_resp_err_t;

typedef struct rd_kafka_message_s {
    rd_kafka_resp_err_t err;
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
#define RD_KAFKA_CONF_OK 0
#define RD_KAFKA_RESP_ERR__PARTITION_EOF (-191)

rd_kafka_conf_t *rd_kafka_conf_new(void);
void rd_kafka_conf_destroy(rd_kafka_conf_t *conf);
int rd_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, char *errstr,
                      size_t errstr_size);
rd_kafka_t *rd_kafka_new(int type, rd_kafka_conf_t *conf, char *errstr, size_t errstr_size);
void rd_kafka_destroy(rd_kafka_t *rk);
rd_kafka_resp_err_t rd_kafka_poll_set_consumer(rd_kafka_t *rk);
rd_kafka_queue_t *rd_kafka_queue_get_consumer(rd_kafka_t *rk);
void rd_kafka_queue_destroy(rd_kafka_queue_t *rkqu);
rd_kafka_topic_partition_list_t *rd_kafka_topic_partition_list_new(int size);
void rd_kafka_topic_partition_list_destroy(rd_kafka_topic_partition_list_t *list);
void *rd_kafka_topic_partition_list_add(rd_kafka_topic_partition_list_t *list, const char *topic,
                                        int32_t partition);
rd_kafka_resp_err_t rd_kafka_topic_partition_list_set_offset(rd_kafka_topic_partition_list_t *list,
                                                             const char *topic, int32_t partition,
                                                             int64_t offset);
rd_kafka_resp_err_t rd_kafka_assign(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *partitions);
rd_kafka_resp_err_t rd_kafka_consumer_close(rd_kafka_t *rk);
ssize_t rd_kafka_consume_batch_queue(rd_kafka_queue_t *rkqu, int timeout_ms, rd_kafka_message_t **rkmessages,
                                     size_t rkmessages_size);
void rd_kafka_message_destroy(rd_kafka_message_t *rkmessage);
int64_t rd_kafka_message_timestamp(const rd_kafka_message_t *rkmessage, int *tstype);
rd_kafka_resp_err_t rd_kafka_message_headers(const rd_kafka_message_t *rkmessage, rd_kafka_headers_t **hdrsp);
size_t rd_kafka_header_cnt(const rd_kafka_headers_t *hdrs);
rd_kafka_resp_err_t rd_kafka_header_get_all(const rd_kafka_headers_t *hdrs, size_t idx, const char **namep,
                                            const void **valuep, size_t *sizep);
const char *rd_kafka_topic_name(const rd_kafka_topic_t *rkt);
const char *rd_kafka_err2str(rd_kafka_resp_err_t err);
const char *rd_kafka_version_str(void);

/* ---- the reader ---- */
#define CONSUME_BATCH 10000

static PyObject *ReadError; /* _rangeread.ReadError(message, code) */

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    char *topic;           /* the assigned partition's topic, NULL when unassigned */
    int32_t partition;
    const rd_kafka_topic_t *rkt; /* the topic handle its messages carry, once seen */
    int64_t position;      /* the records (and EOFs) seen reach up to here */
    rd_kafka_message_t **held; /* one chunk's records, until its buffers are built */
    rd_kafka_headers_t **hdrs;
    size_t held_cap;
} Reader;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int Reader_init(Reader *self, PyObject *args, PyObject *kwds) {
    PyObject *conf_dict;
    char errstr[512];
    if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &conf_dict)) return -1;
    if (self->rk != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "already initialised");
        return -1;
    }
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(conf_dict, &pos, &name, &value)) {
        const char *n = PyUnicode_AsUTF8(name), *v = n ? PyUnicode_AsUTF8(value) : NULL;
        if (v == NULL) {
            rd_kafka_conf_destroy(conf);
            return -1; /* not str: the Python side passes strings */
        }
        if (rd_kafka_conf_set(conf, n, v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "%s: %s", n, errstr);
            return -1;
        }
    }
    self->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (self->rk == NULL) {
        rd_kafka_conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "rd_kafka_new: %s", errstr);
        return -1;
    }
    rd_kafka_poll_set_consumer(self->rk); /* as confluent-kafka's Consumer does */
    self->queue = rd_kafka_queue_get_consumer(self->rk);
    return 0;
}

static void release_held(Reader *self, size_t n) {
    for (size_t i = 0; i < n; i++) rd_kafka_message_destroy(self->held[i]);
}

static PyObject *unassign_impl(Reader *self) {
    if (self->topic != NULL) {
        rd_kafka_resp_err_t err;
        Py_BEGIN_ALLOW_THREADS
        err = rd_kafka_assign(self->rk, NULL);
        Py_END_ALLOW_THREADS
        PyMem_Free(self->topic);
        self->topic = NULL;
        self->rkt = NULL;
        if (err) return PyErr_Format(ReadError, "unassign: %s", rd_kafka_err2str(err));
    }
    Py_RETURN_NONE;
}

static PyObject *Reader_assign(Reader *self, PyObject *args) {
    const char *topic;
    int partition;
    long long start;
    if (!PyArg_ParseTuple(args, "siL", &topic, &partition, &start)) return NULL;
    if (self->rk == NULL) return PyErr_Format(PyExc_RuntimeError, "closed");
    if (unassign_impl(self) == NULL) return NULL;
    Py_DECREF(Py_None);
    size_t len = strlen(topic);
    self->topic = PyMem_Malloc(len + 1);
    if (self->topic == NULL) return PyErr_NoMemory();
    memcpy(self->topic, topic, len + 1);
    self->partition = partition;
    self->position = start;
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic, partition);
    rd_kafka_topic_partition_list_set_offset(list, topic, partition, start);
    rd_kafka_resp_err_t err;
    Py_BEGIN_ALLOW_THREADS
    err = rd_kafka_assign(self->rk, list);
    Py_END_ALLOW_THREADS
    rd_kafka_topic_partition_list_destroy(list);
    if (err) {
        PyMem_Free(self->topic);
        self->topic = NULL;
        return PyErr_Format(ReadError, "assign: %s", rd_kafka_err2str(err));
    }
    Py_RETURN_NONE;
}

static PyObject *Reader_unassign(Reader *self, PyObject *unused) { return unassign_impl(self); }

/* Whether a message (or event) is of the assigned partition; NULL rkt: of no partition. */
static int ours(Reader *self, const rd_kafka_message_t *m) {
    if (m->partition != self->partition) return 0;
    if (m->rkt == self->rkt) return 1;
    if (strcmp(rd_kafka_topic_name(m->rkt), self->topic) != 0) return 0;
    self->rkt = m->rkt;
    return 1;
}

static PyObject *new_bytes(Py_ssize_t size, char **data) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b != NULL) *data = PyBytes_AS_STRING(b);
    return b;
}

/* A validity bitmap (Arrow: LSB first) of n bits, all set; the caller clears the nulls. */
static PyObject *new_bitmap(Py_ssize_t n, uint8_t **bits) {
    char *data;
    PyObject *b = new_bytes((n + 7) / 8, &data);
    if (b != NULL) {
        memset(data, 0xff, (n + 7) / 8);
        *bits = (uint8_t *)data;
    }
    return b;
}

#define CLEAR_BIT(bits, i) ((bits)[(i) >> 3] &= (uint8_t) ~(1u << ((i)&7)))

/* One binary column: (validity bytes or None, null count, int32 offsets bytes, data bytes). */
static PyObject *binary_column(Reader *self, size_t n, int use_key) {
    size_t total = 0, nulls = 0;
    for (size_t i = 0; i < n; i++) {
        const rd_kafka_message_t *m = self->held[i];
        const void *p = use_key ? m->key : m->payload;
        if (p == NULL) nulls++;
        else total += use_key ? m->key_len : m->len;
    }
    if (total > INT32_MAX) return PyErr_Format(ReadError, "chunk over 2 GiB of %s", use_key ? "keys" : "values");
    char *offs_c = NULL, *data = NULL;
    uint8_t *bits = NULL;
    PyObject *valid = nulls ? new_bitmap((Py_ssize_t)n, &bits) : (Py_INCREF(Py_None), Py_None);
    PyObject *offsets = new_bytes((Py_ssize_t)(n + 1) * 4, &offs_c);
    PyObject *values = new_bytes((Py_ssize_t)total, &data);
    if (valid == NULL || offsets == NULL || values == NULL) goto fail;
    int32_t *offs = (int32_t *)offs_c, at = 0;
    for (size_t i = 0; i < n; i++) {
        const rd_kafka_message_t *m = self->held[i];
        const void *p = use_key ? m->key : m->payload;
        offs[i] = at;
        if (p == NULL) {
            CLEAR_BIT(bits, i);
            continue;
        }
        size_t len = use_key ? m->key_len : m->len;
        memcpy(data + at, p, len);
        at += (int32_t)len;
    }
    offs[n] = at;
    return Py_BuildValue("(NnNN)", valid, (Py_ssize_t)nulls, offsets, values);
fail:
    Py_XDECREF(valid);
    Py_XDECREF(offsets);
    Py_XDECREF(values);
    return NULL;
}

/* The headers column's buffers, or None when no record of the chunk has headers:
 * (list validity, list null count, list int32 offsets, name offsets, name data, value validity or
 *  None, value null count, value offsets, value data). */
static PyObject *headers_column(Reader *self, size_t n) {
    size_t count = 0, names = 0, values = 0, value_nulls = 0, without = 0;
    for (size_t i = 0; i < n; i++) {
        rd_kafka_headers_t *h = NULL;
        if (rd_kafka_message_headers(self->held[i], &h) != 0) h = NULL;
        self->hdrs[i] = h;
        if (h == NULL) {
            without++;
            continue;
        }
        size_t c = rd_kafka_header_cnt(h);
        for (size_t j = 0; j < c; j++) {
            const char *name;
            const void *value;
            size_t size;
            if (rd_kafka_header_get_all(h, j, &name, &value, &size) != 0) continue;
            count++;
            names += strlen(name);
            if (value == NULL) value_nulls++;
            else values += size;
        }
    }
    if (count == 0 && without == n) Py_RETURN_NONE;
    if (names > INT32_MAX || values > INT32_MAX || count > INT32_MAX)
        return PyErr_Format(ReadError, "chunk over 2 GiB of headers");
    char *loffs_c = NULL, *noffs_c = NULL, *ndata = NULL, *voffs_c = NULL, *vdata = NULL;
    uint8_t *lbits = NULL, *vbits = NULL;
    PyObject *lvalid = without ? new_bitmap((Py_ssize_t)n, &lbits) : (Py_INCREF(Py_None), Py_None);
    PyObject *loffs = new_bytes((Py_ssize_t)(n + 1) * 4, &loffs_c);
    PyObject *noffs = new_bytes((Py_ssize_t)(count + 1) * 4, &noffs_c);
    PyObject *nbytes = new_bytes((Py_ssize_t)names, &ndata);
    PyObject *vvalid = value_nulls ? new_bitmap((Py_ssize_t)count, &vbits) : (Py_INCREF(Py_None), Py_None);
    PyObject *voffs = new_bytes((Py_ssize_t)(count + 1) * 4, &voffs_c);
    PyObject *vbytes = new_bytes((Py_ssize_t)values, &vdata);
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
    int32_t *lo = (int32_t *)loffs_c, *no = (int32_t *)noffs_c, *vo = (int32_t *)voffs_c;
    int32_t k = 0, nat = 0, vat = 0;
    for (size_t i = 0; i < n; i++) {
        lo[i] = k;
        rd_kafka_headers_t *h = self->hdrs[i];
        if (h == NULL) {
            CLEAR_BIT(lbits, i);
            continue;
        }
        size_t c = rd_kafka_header_cnt(h);
        for (size_t j = 0; j < c; j++) {
            const char *name;
            const void *value;
            size_t size;
            if (rd_kafka_header_get_all(h, j, &name, &value, &size) != 0) continue;
            size_t nl = strlen(name);
            no[k] = nat;
            vo[k] = vat;
            memcpy(ndata + nat, name, nl);
            nat += (int32_t)nl;
            if (value == NULL) CLEAR_BIT(vbits, k);
            else {
                memcpy(vdata + vat, value, size);
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

/* read(end, max_records, wait_ms, stall_s) -> (count, position, key, value, offsets, timestamps_us,
 * timestamp_types, headers): the assigned range's next records, at most max_records, as column
 * buffers; count 0 once the range is done (position >= end). */
static PyObject *Reader_read(Reader *self, PyObject *args) {
    long long end;
    Py_ssize_t max_records;
    int wait_ms;
    double stall_s;
    if (!PyArg_ParseTuple(args, "Lnid", &end, &max_records, &wait_ms, &stall_s)) return NULL;
    if (self->topic == NULL) return PyErr_Format(PyExc_RuntimeError, "no partition assigned");
    if (max_records <= 0) return PyErr_Format(PyExc_ValueError, "max_records must be positive");
    if ((size_t)max_records + CONSUME_BATCH > self->held_cap) {
        size_t cap = (size_t)max_records + CONSUME_BATCH;
        rd_kafka_message_t **held = PyMem_Realloc(self->held, cap * sizeof *held);
        if (held == NULL) return PyErr_NoMemory();
        self->held = held;
        rd_kafka_headers_t **hdrs = PyMem_Realloc(self->hdrs, cap * sizeof *hdrs);
        if (hdrs == NULL) return PyErr_NoMemory();
        self->hdrs = hdrs;
        self->held_cap = cap;
    }
    size_t n = 0;
    double deadline = now_s() + stall_s;
    rd_kafka_resp_err_t failed = 0;
    char failure[256] = "";
    while (self->position < end && n < (size_t)max_records && !failed) {
        size_t want = CONSUME_BATCH;
        if ((size_t)max_records - n < want) want = (size_t)max_records - n;
        if ((uint64_t)(end - self->position) < want) want = (size_t)(end - self->position);
        rd_kafka_message_t **batch = self->held + n; /* consumed in place, compacted below */
        ssize_t got;
        Py_BEGIN_ALLOW_THREADS
        got = rd_kafka_consume_batch_queue(self->queue, wait_ms, batch, want);
        Py_END_ALLOW_THREADS
        if (got < 0) {
            release_held(self, n);
            return PyErr_Format(ReadError, "rd_kafka_consume_batch_queue failed");
        }
        size_t kept = 0;
        for (ssize_t i = 0; i < got; i++) {
            rd_kafka_message_t *m = batch[i];
            if (m->err) {
                if (m->rkt == NULL) {
                    /* of no partition (a broker down, ...): confluent-kafka gives these to the
                     * sink's error_cb, which logs them; the stall timeout bounds the wait. */
                } else if (!ours(self, m)) {
                    /* a stale event of a partition read before */
                } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                    if (m->offset > self->position) self->position = m->offset;
                } else if (!failed) {
                    failed = m->err;
                    snprintf(failure, sizeof failure, "%s", rd_kafka_err2str(m->err));
                }
                rd_kafka_message_destroy(m);
            } else if (!ours(self, m) || m->offset < self->position || failed) {
                rd_kafka_message_destroy(m);
            } else if (m->offset >= end) {
                self->position = end; /* past the range: the rest of the batch is too */
                rd_kafka_message_destroy(m);
            } else {
                self->position = m->offset + 1;
                batch[kept++] = m;
            }
        }
        n += kept;
        if (kept || self->position >= end) deadline = now_s() + stall_s;
        else if (now_s() > deadline && !failed) {
            release_held(self, n);
            PyObject *e = Py_BuildValue("(si)", "stalled", 0);
            PyErr_SetObject(ReadError, e);
            Py_XDECREF(e);
            return NULL;
        }
    }
    if (failed) {
        release_held(self, n);
        PyObject *e = Py_BuildValue("(si)", failure, failed);
        PyErr_SetObject(ReadError, e);
        Py_XDECREF(e);
        return NULL;
    }
    PyObject *key = NULL, *value = NULL, *offsets = NULL, *stamps = NULL, *kinds = NULL, *headers = NULL;
    char *o_c = NULL, *s_c = NULL, *k_c = NULL;
    key = binary_column(self, n, 1);
    value = key ? binary_column(self, n, 0) : NULL;
    offsets = value ? new_bytes((Py_ssize_t)n * 8, &o_c) : NULL;
    stamps = offsets ? new_bytes((Py_ssize_t)n * 8, &s_c) : NULL;
    kinds = stamps ? new_bytes((Py_ssize_t)n * 4, &k_c) : NULL;
    headers = kinds ? headers_column(self, n) : NULL;
    if (headers == NULL) {
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(offsets);
        Py_XDECREF(stamps);
        Py_XDECREF(kinds);
        release_held(self, n);
        return NULL;
    }
    int64_t *o = (int64_t *)o_c, *s = (int64_t *)s_c;
    int32_t *k = (int32_t *)k_c;
    for (size_t i = 0; i < n; i++) {
        const rd_kafka_message_t *m = self->held[i];
        int tstype = 0;
        o[i] = m->offset;
        /* As RangeReader: microseconds (ms * 1000), and Spark's kinds (librdkafka's minus one). */
        s[i] = rd_kafka_message_timestamp(m, &tstype) * 1000;
        k[i] = tstype - 1;
    }
    release_held(self, n);
    return Py_BuildValue("(nLNNNNNN)", (Py_ssize_t)n, (long long)self->position, key, value, offsets, stamps,
                         kinds, headers);
}

static PyObject *close_impl(Reader *self) {
    if (self->rk != NULL) {
        if (self->topic != NULL) {
            PyMem_Free(self->topic);
            self->topic = NULL;
        }
        rd_kafka_queue_destroy(self->queue);
        Py_BEGIN_ALLOW_THREADS
        rd_kafka_consumer_close(self->rk);
        rd_kafka_destroy(self->rk);
        Py_END_ALLOW_THREADS
        self->rk = NULL;
        self->queue = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Reader_close(Reader *self, PyObject *unused) { return close_impl(self); }

static void Reader_dealloc(Reader *self) {
    PyObject *r = close_impl(self);
    Py_XDECREF(r);
    PyMem_Free(self->held);
    PyMem_Free(self->hdrs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Reader_methods[] = {
    {"assign", (PyCFunction)Reader_assign, METH_VARARGS, "assign(topic, partition, start): the one partition"},
    {"unassign", (PyCFunction)Reader_unassign, METH_NOARGS, "unassign()"},
    {"read", (PyCFunction)Reader_read, METH_VARARGS, "read(end, max_records, wait_ms, stall_s)"},
    {"close", (PyCFunction)Reader_close, METH_NOARGS, "close()"},
    {NULL}};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_rangeread.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(conf: dict[str, str]): a librdkafka consumer reading one assigned range at a time",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

static PyObject *librdkafka_version(PyObject *m, PyObject *unused) {
    return PyUnicode_FromString(rd_kafka_version_str());
}

static PyMethodDef module_methods[] = {
    {"librdkafka_version", librdkafka_version, METH_NOARGS, "the linked librdkafka's version"}, {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rangeread", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__rangeread(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    ReadError = PyErr_NewException("_rangeread.ReadError", PyExc_RuntimeError, NULL);
    Py_INCREF(&ReaderType);
    if (ReadError == NULL || PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObject(m, "ReadError", ReadError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
