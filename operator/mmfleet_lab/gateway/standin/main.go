// Command gateway-standin stands in for Envoy in front of an InferencePool, in mmfleet's lab only: an HTTP server
// that asks the pool's endpoint picker (EPP) where each request goes over Envoy's ext_proc protocol, then sends the
// request there. It speaks ext_proc the way the Inference Extension's own Envoy configuration sets it up
// (sigs.k8s.io/gateway-api-inference-extension@v1.5.0 test/testdata/envoy.yaml:105-112: headers SENT, request and
// response bodies FULL_DUPLEX_STREAMED; the endpoint from the x-gateway-destination-endpoint header, :161-163).
//
// Per request, one Process stream, in the order the picker expects (pkg/epp/handlers/server.go:195-327):
// request headers with the pseudo-headers, the whole body with end_of_stream; then the picker answers either an
// ImmediateResponse (a refusal: passed to the client with its status and body) or the request headers' mutation
// (the chosen endpoint) followed by the (re-serialised) body in streamed chunks, the last with end_of_stream
// (pkg/common/envoy/chunking.go). The request goes to that endpoint; its answer's headers and body go back through
// the stream, so the picker completes its bookkeeping (response.go), and the client gets the body the picker
// returns, with x-mmfleet-endpoint naming the endpoint that served it.
//
// Unlike Envoy it buffers whole bodies (a streamed answer reaches the client at its end), has no retries, and
// answers 502 when the endpoint cannot be reached (Envoy: 503).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	// pkg/epp/metadata/consts.go:26-28: the header and the dynamic-metadata namespace/key naming the pick.
	destinationHeader   = "x-gateway-destination-endpoint"
	destinationMetadata = "envoy.lb"
	// The answer's header naming the endpoint that served it (mmfleet's, for tests).
	servedByHeader  = "x-mmfleet-endpoint"
	requestIDHeader = "x-request-id"
)

type gateway struct {
	picker   extprocv3.ExternalProcessorClient
	upstream *http.Client
}

func main() {
	listen := flag.String("listen", "", "where to serve HTTP: unix:<path> or <host>:<port>")
	extProc := flag.String("ext-proc", "", "the endpoint picker's ext_proc gRPC address, <host>:<port>")
	plaintext := flag.Bool("ext-proc-plaintext", false,
		"ext_proc without TLS (for a picker run with --secure-serving=false; by default it serves TLS with a "+
			"self-signed certificate, which gateways accept unverified: config/charts/inferencepool/templates/istio.yaml)")
	timeout := flag.Duration("upstream-timeout", 10*time.Minute, "the longest a model server may take to answer")
	flag.Parse()
	if *listen == "" || *extProc == "" {
		log.Fatal("--listen and --ext-proc are required")
	}
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})
	if *plaintext {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(*extProc, grpc.WithTransportCredentials(creds))
	if err != nil {
		log.Fatalf("ext_proc client for %s: %v", *extProc, err)
	}
	defer conn.Close()

	listener, err := listenOn(*listen)
	if err != nil {
		log.Fatalf("listen on %s: %v", *listen, err)
	}
	server := &http.Server{Handler: &gateway{
		picker:   extprocv3.NewExternalProcessorClient(conn),
		upstream: &http.Client{Timeout: *timeout},
	}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	log.Printf("gateway stand-in serving on %s, picker at %s", *listen, *extProc)
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("serve: %v", err)
	}
}

func listenOn(address string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(address, "unix:"); ok {
		_ = os.Remove(path)
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", address)
}

// exchange is one request's ext_proc stream.
type exchange struct {
	stream extprocv3.ExternalProcessor_ProcessClient
}

func (x *exchange) send(request *extprocv3.ProcessingRequest) error {
	return x.stream.Send(request)
}

// refused is the picker's ImmediateResponse, for the client as it is.
type refused struct{ response *extprocv3.ImmediateResponse }

func (r refused) Error() string {
	return fmt.Sprintf("the picker answered %d: %s", r.response.GetStatus().GetCode(), r.response.GetBody())
}

// recv is the picker's next message; an ImmediateResponse ends the exchange as a “refused“ error.
func (x *exchange) recv() (*extprocv3.ProcessingResponse, error) {
	response, err := x.stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("ext_proc stream: %w", err)
	}
	if immediate := response.GetImmediateResponse(); immediate != nil {
		return nil, refused{immediate}
	}
	return response, nil
}

// body collects streamed body mutations up to end_of_stream, each from the phase “get“ reads.
func (x *exchange) body(get func(*extprocv3.ProcessingResponse) *extprocv3.BodyResponse) ([]byte, error) {
	var out []byte
	for {
		response, err := x.recv()
		if err != nil {
			return nil, err
		}
		phase := get(response)
		if phase == nil {
			return nil, fmt.Errorf("ext_proc: expected a body response, got %T", response.GetResponse())
		}
		streamed := phase.GetResponse().GetBodyMutation().GetStreamedResponse()
		if streamed == nil {
			return nil, errors.New("ext_proc: a body response without a streamed body mutation")
		}
		out = append(out, streamed.GetBody()...)
		if streamed.GetEndOfStream() {
			return out, nil
		}
	}
}

func headerMap(headers http.Header, pseudo ...string) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for i := 0; i+1 < len(pseudo); i += 2 {
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: pseudo[i], RawValue: []byte(pseudo[i+1])})
	}
	for key, values := range headers {
		for _, value := range values {
			out.Headers = append(out.Headers, &corev3.HeaderValue{Key: strings.ToLower(key), RawValue: []byte(value)})
		}
	}
	return out
}

// mutate applies a header mutation (set wins over what is there; removals last) to “headers“.
func mutate(headers http.Header, mutation *extprocv3.HeaderMutation) {
	for _, option := range mutation.GetSetHeaders() {
		header := option.GetHeader()
		value := string(header.GetRawValue())
		if value == "" {
			value = header.GetValue()
		}
		if strings.HasPrefix(header.GetKey(), ":") {
			continue
		}
		headers.Set(header.GetKey(), value)
	}
	for _, key := range mutation.GetRemoveHeaders() {
		headers.Del(key)
	}
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if r.Header.Get(requestIDHeader) == "" { // Envoy sets one (generate_request_id)
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		r.Header.Set(requestIDHeader, hex.EncodeToString(id))
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stream, err := g.picker.Process(ctx)
	if err != nil {
		http.Error(w, "ext_proc stream to the picker: "+err.Error(), http.StatusInternalServerError)
		return
	}
	x := &exchange{stream}
	status, headers, answer, endpoint, err := g.route(x, r, body)
	var refusal refused
	switch {
	case errors.As(err, &refusal):
		for key, values := range headersOf(refusal.response.GetHeaders()) {
			w.Header()[key] = values
		}
		code := int(refusal.response.GetStatus().GetCode())
		if code == 0 {
			code = http.StatusInternalServerError
		}
		w.WriteHeader(code)
		_, _ = w.Write(refusal.response.GetBody())
		return
	case err != nil:
		code := http.StatusInternalServerError // the pool fails closed (failureMode: FailClose)
		var unreachable upstreamError
		if errors.As(err, &unreachable) {
			code = http.StatusBadGateway
		}
		if endpoint != "" {
			w.Header().Set(servedByHeader, endpoint)
		}
		http.Error(w, err.Error(), code)
		return
	}
	_ = stream.CloseSend()
	for key, values := range headers {
		w.Header()[key] = values
	}
	w.Header().Set(servedByHeader, endpoint)
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

type upstreamError struct{ error }

func headersOf(mutation *extprocv3.HeaderMutation) http.Header {
	out := http.Header{}
	mutate(out, mutation)
	return out
}

// route runs one request through the picker and the endpoint it picks: the answer's status, headers and body as
// the picker passes them back, and the endpoint.
func (g *gateway) route(x *exchange, r *http.Request, body []byte) (int, http.Header, []byte, string, error) {
	requestHeaders := headerMap(r.Header, ":method", r.Method, ":path", r.URL.RequestURI(), ":authority", r.Host,
		":scheme", "http")
	noBody := len(body) == 0
	err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: requestHeaders, EndOfStream: noBody}}})
	if err == nil && !noBody {
		err = x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	}
	if err != nil {
		return 0, nil, nil, "", fmt.Errorf("sending the request to the picker: %w", err)
	}
	picked, err := x.recv()
	if err != nil {
		return 0, nil, nil, "", err
	}
	headersResponse := picked.GetRequestHeaders()
	if headersResponse == nil {
		return 0, nil, nil, "", fmt.Errorf("ext_proc: expected the request headers' response, got %T", picked.GetResponse())
	}
	forwarded := r.Header.Clone()
	mutate(forwarded, headersResponse.GetResponse().GetHeaderMutation())
	endpoint := forwarded.Get(destinationHeader)
	if endpoint == "" { // the other way the picker says it (request.go:143-169)
		lb := picked.GetDynamicMetadata().GetFields()[destinationMetadata].GetStructValue()
		endpoint = lb.GetFields()[destinationHeader].GetStringValue()
	}
	endpoint, _, _ = strings.Cut(endpoint, ",") // more than one only with maxNumOfEndpoints > 1; Envoy takes the first
	if endpoint == "" {
		return 0, nil, nil, "", errors.New("the picker named no endpoint")
	}
	if !noBody {
		if body, err = x.body((*extprocv3.ProcessingResponse).GetRequestBody); err != nil {
			return 0, nil, nil, endpoint, err
		}
	}

	upstream, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+endpoint+r.URL.RequestURI(),
		bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, endpoint, err
	}
	upstream.Header = forwarded
	upstream.Header.Del("Content-Length") // the body's own length (the picker may have re-serialised it)
	answer, err := g.upstream.Do(upstream)
	if err != nil {
		return 0, nil, nil, endpoint, upstreamError{fmt.Errorf("upstream %s: %w", endpoint, err)}
	}
	defer answer.Body.Close()
	answerBody, err := io.ReadAll(answer.Body)
	if err != nil {
		return 0, nil, nil, endpoint, upstreamError{fmt.Errorf("upstream %s: reading the answer: %w", endpoint, err)}
	}

	// The answer through the picker: its headers (the picker reads the status and the content type), then its body.
	responseHeaders := headerMap(answer.Header, ":status", strconv.Itoa(answer.StatusCode))
	err = x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: responseHeaders}}})
	if err == nil {
		err = x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: answerBody, EndOfStream: true}}})
	}
	if err != nil {
		return 0, nil, nil, endpoint, fmt.Errorf("sending the answer to the picker: %w", err)
	}
	headerAnswer, err := x.recv()
	if err != nil {
		return 0, nil, nil, endpoint, err
	}
	if headerAnswer.GetResponseHeaders() == nil {
		return 0, nil, nil, endpoint, fmt.Errorf("ext_proc: expected the response headers' response, got %T",
			headerAnswer.GetResponse())
	}
	clientHeaders := answer.Header.Clone()
	mutate(clientHeaders, headerAnswer.GetResponseHeaders().GetResponse().GetHeaderMutation())
	clientHeaders.Del("Content-Length")
	clientBody, err := x.body((*extprocv3.ProcessingResponse).GetResponseBody)
	if err != nil {
		return 0, nil, nil, endpoint, err
	}
	return answer.StatusCode, clientHeaders, clientBody, endpoint, nil
}
