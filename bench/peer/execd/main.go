// Stand-in for OpenSandbox's execd, for the benchmark peer only.
//
// The official execd (Go, beego) cannot be built on the benchmark hosts: its
// Go modules cannot be downloaded. This program serves the subset of execd's
// API that the benchmark drives through the unmodified Python SDK, in execd's
// wire format, using only the Go standard library:
//
//	GET  /ping                     200
//	POST /command                  SSE in execd's "legacy" framing: one JSON
//	                               object + "\n\n" per event: init, stdout /
//	                               stderr per line, then execution_complete
//	                               (exit 0) or error {ename: CommandExecError,
//	                               evalue: "<exit code>"}; stream closed at the end.
//	                               background=true: init + execution_complete at once.
//	POST /files/upload             multipart pairs (metadata JSON, file)
//	GET  /files/download?path=     raw bytes
//	ANY  /proxy/{port}/{path}      reverse proxy to 127.0.0.1:{port}, as execd's
//	                               ProxyMiddleware does (new transport per request);
//	                               the SDK reaches execd itself through /proxy/44772/...
//
// Differences from the real execd that favour the peer: output is read from
// pipes as it arrives (real execd writes it to files and tails them every
// 100 ms), and the binary is smaller (no beego, no Jupyter client).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var counter uint64

func nowMs() int64 { return time.Now().UnixNano() / int64(time.Millisecond) }

func newID() string {
	n := atomic.AddUint64(&counter, 1)
	return fmt.Sprintf("%x-%d", time.Now().UnixNano(), n)
}

func jsonError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": msg})
}

type event struct {
	Type          string                 `json:"type"`
	Text          string                 `json:"text,omitempty"`
	ExecutionTime *int64                 `json:"execution_time,omitempty"`
	Timestamp     int64                  `json:"timestamp"`
	Error         map[string]interface{} `json:"error,omitempty"`
}

// sseWriter serialises events from several goroutines onto one response.
type sseWriter struct {
	mu sync.Mutex
	w  http.ResponseWriter
	f  http.Flusher
}

func (s *sseWriter) send(ev event) {
	ev.Timestamp = nowMs()
	b, _ := json.Marshal(ev)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.w.Write(b)
	_, _ = s.w.Write([]byte("\n\n"))
	if s.f != nil {
		s.f.Flush()
	}
}

type runRequest struct {
	Command    string            `json:"command"`
	Argv       []string          `json:"argv"`
	Cwd        string            `json:"cwd"`
	Background bool              `json:"background"`
	Timeout    int64             `json:"timeout"`
	Envs       map[string]string `json:"envs"`
}

func shell() string {
	// Real execd runs `bash -c`; the benchmark images include busybox, which
	// has no bash. pvisor runs `/bin/sh -c` too, so both sides use sh.
	return "/bin/sh"
}

func buildCmd(req *runRequest) *exec.Cmd {
	var cmd *exec.Cmd
	if len(req.Argv) > 0 {
		cmd = exec.Command(req.Argv[0], req.Argv[1:]...)
	} else {
		cmd = exec.Command(shell(), "-c", req.Command)
	}
	cmd.Dir = req.Cwd
	env := os.Environ()
	for k, v := range req.Envs {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

func handleCommand(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		jsonError(w, http.StatusMethodNotAllowed, "INVALID_REQUEST", "POST only")
		return
	}
	var req runRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || (req.Command == "" && len(req.Argv) == 0) {
		jsonError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "command is required")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	sse := &sseWriter{w: w, f: f}
	id := newID()
	start := time.Now()
	cmd := buildCmd(&req)

	if req.Background {
		logf, err := os.OpenFile(filepath.Join(os.TempDir(), ".execd-"+id+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err == nil {
			cmd.Stdout, cmd.Stderr = logf, logf
		}
		if err := cmd.Start(); err != nil {
			sse.send(event{Type: "init", Text: id})
			sse.send(event{Type: "error", Error: map[string]interface{}{"ename": "CommandExecError", "evalue": err.Error(), "traceback": []string{err.Error()}}})
			return
		}
		go func() { _ = cmd.Wait(); if logf != nil { logf.Close() } }()
		sse.send(event{Type: "init", Text: id})
		ms := time.Since(start).Milliseconds()
		sse.send(event{Type: "execution_complete", ExecutionTime: &ms})
		return
	}

	outR, outW, err1 := os.Pipe()
	errR, errW, err2 := os.Pipe()
	if err1 != nil || err2 != nil {
		sse.send(event{Type: "init", Text: id})
		sse.send(event{Type: "error", Error: map[string]interface{}{"ename": "CommandExecError", "evalue": "pipe", "traceback": []string{"pipe"}}})
		return
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if err := cmd.Start(); err != nil {
		outW.Close()
		errW.Close()
		outR.Close()
		errR.Close()
		sse.send(event{Type: "init", Text: id})
		sse.send(event{Type: "error", Error: map[string]interface{}{"ename": "CommandExecError", "evalue": err.Error(), "traceback": []string{err.Error()}}})
		return
	}
	outW.Close()
	errW.Close()
	sse.send(event{Type: "init", Text: id})

	var wg sync.WaitGroup
	pump := func(rd *os.File, typ string) {
		defer wg.Done()
		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
		for sc.Scan() {
			sse.send(event{Type: typ, Text: sc.Text()})
		}
	}
	wg.Add(2)
	go pump(outR, "stdout")
	go pump(errR, "stderr")

	var timer *time.Timer
	if req.Timeout > 0 {
		timer = time.AfterFunc(time.Duration(req.Timeout)*time.Millisecond, func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		})
	}
	werr := cmd.Wait()
	if timer != nil {
		timer.Stop()
	}
	// Output of children that outlive the shell: give them a moment, then stop reading.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
		outR.Close()
		errR.Close()
		<-done
	}
	outR.Close()
	errR.Close()

	if werr != nil {
		code := 1
		if ee, ok := werr.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		sse.send(event{Type: "error", Error: map[string]interface{}{
			"ename": "CommandExecError", "evalue": strconv.Itoa(code), "traceback": []string{werr.Error()},
		}})
		return
	}
	ms := time.Since(start).Milliseconds()
	sse.send(event{Type: "execution_complete", ExecutionTime: &ms})
}

type fileMeta struct {
	Path string `json:"path"`
	Mode *int   `json:"mode"`
}

func octalMode(m *int, def os.FileMode) os.FileMode {
	if m == nil {
		return def
	}
	v, err := strconv.ParseUint(strconv.Itoa(*m), 8, 32)
	if err != nil {
		return def
	}
	return os.FileMode(v)
}

func handleUpload(w http.ResponseWriter, r *http.Request) {
	mr, err := r.MultipartReader()
	if err != nil {
		jsonError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", err.Error())
		return
	}
	var pending *fileMeta
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			jsonError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", err.Error())
			return
		}
		if part.FormName() == "metadata" {
			var m fileMeta
			if err := json.NewDecoder(part).Decode(&m); err != nil || m.Path == "" {
				jsonError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "bad metadata")
				return
			}
			pending = &m
			continue
		}
		if pending == nil {
			jsonError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "file part without metadata")
			return
		}
		if err := writePart(pending, part); err != nil {
			jsonError(w, http.StatusInternalServerError, "RUNTIME_ERROR", err.Error())
			return
		}
		pending = nil
	}
	w.WriteHeader(http.StatusOK)
}

func writePart(m *fileMeta, part *multipart.Part) error {
	if err := os.MkdirAll(filepath.Dir(m.Path), 0o755); err != nil {
		return err
	}
	mode := octalMode(m.Mode, 0o644)
	f, err := os.OpenFile(m.Path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, part); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(m.Path, mode)
}

func handleDownload(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	f, err := os.Open(p)
	if err != nil {
		jsonError(w, http.StatusNotFound, "FILE_NOT_FOUND", err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = io.Copy(w, f)
}

// proxyMiddleware mirrors execd's ProxyMiddleware: /proxy/{port}/{path} is
// reverse-proxied to 127.0.0.1:{port}/{path} with a fresh transport.
func proxyMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/proxy/") {
			next.ServeHTTP(w, r)
			return
		}
		parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/proxy/"), "/", 2)
		if len(parts) == 0 || parts[0] == "" {
			http.Error(w, "port is required", http.StatusBadRequest)
			return
		}
		port := parts[0]
		path := "/"
		if len(parts) == 2 && parts[1] != "" {
			path += parts[1]
		}
		target := &url.URL{Scheme: "http", Host: "127.0.0.1:" + port, Path: path}
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.Director = func(req *http.Request) {
			req.URL.Scheme = "http"
			req.URL.Host = target.Host
			req.URL.Path = path
			req.URL.RawQuery = r.URL.RawQuery
			req.URL.RawPath = ""
			req.RequestURI = ""
			req.Header.Set("X-Forwarded-Proto", "http")
			req.Header.Del("X-Forwarded-Host")
		}
		proxy.Transport = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 600 * time.Second, KeepAlive: 600 * time.Second}).DialContext,
			MaxIdleConns:        100,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     600 * time.Second,
		}
		proxy.FlushInterval = -1
		proxy.ErrorHandler = func(rw http.ResponseWriter, req *http.Request, err error) {
			http.Error(rw, "Bad Gateway", http.StatusBadGateway)
		}
		proxy.ServeHTTP(w, r)
	})
}

func main() {
	port := flag.Int("port", 44772, "listen port")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("/ping", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/command", handleCommand)
	mux.HandleFunc("/files/upload", handleUpload)
	mux.HandleFunc("/files/download", handleDownload)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		jsonError(w, http.StatusNotFound, "NOT_FOUND", "not served by the benchmark stand-in execd: "+r.URL.Path)
	})
	srv := &http.Server{Addr: fmt.Sprintf(":%d", *port), Handler: proxyMiddleware(mux)}
	log.Printf("stand-in execd (benchmark peer) listening on %s", srv.Addr)
	log.Fatal(srv.ListenAndServe())
}
