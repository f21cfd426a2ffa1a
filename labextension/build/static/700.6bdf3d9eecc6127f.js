"use strict";(self.rspackChunkmlms_nb_lab=self.rspackChunkmlms_nb_lab||[]).push([[700],{646(r,e,o){var t=o(601),n=o.n(t),a=o(314),l=(o.n(a))()(n());l.push([r.id,`/* mlms-nb runs sidebar and timeline panel; colours from the JupyterLab theme variables */
.mlms-runs { display: flex; flex-direction: column; background: var(--jp-layout-color1); color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size1); min-width: 260px; overflow: hidden; }
.mlms-runs-head { display: flex; align-items: center; justify-content: space-between; padding: 6px 8px 0; }
.mlms-runs-head h3 { margin: 0; font-size: var(--jp-ui-font-size2); }
.mlms-runs-controls { display: flex; gap: 4px; padding: 6px 8px; }
.mlms-runs-search { flex: 1; min-width: 0; }
.mlms-runs-status { padding: 0 8px 4px; color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); }
.mlms-error { color: var(--jp-error-color1); }
.mlms-runs-list { list-style: none; margin: 0; padding: 0; overflow-y: auto; flex: 1; }
.mlms-run { padding: 6px 8px; border-bottom: 1px solid var(--jp-border-color2); }
.mlms-run-title { display: flex; justify-content: space-between; font-weight: 600; }
.mlms-run-facts, .mlms-run-id { color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); margin-top: 2px; }
.mlms-badge { font-weight: normal; font-size: var(--jp-ui-font-size0); border-radius: 3px; padding: 0 4px; }
.mlms-complete { background: var(--jp-success-color3, #c8e6c9); }
.mlms-partial { background: var(--jp-warn-color3, #ffe0b2); }
.mlms-run-traces { display: flex; flex-wrap: wrap; gap: 3px; margin-top: 4px; }
.mlms-chip, .mlms-btn { cursor: pointer; border: 1px solid var(--jp-border-color1); border-radius: 3px;
  background: var(--jp-layout-color2); color: var(--jp-ui-font-color1); font-size: var(--jp-ui-font-size0); padding: 1px 6px; }
.mlms-chip:hover, .mlms-btn:hover { background: var(--jp-layout-color3); }
.mlms-ab { color: var(--jp-brand-color1); }
.mlms-on { background: var(--jp-brand-color3); }
.mlms-timeline { display: flex; flex-direction: column; background: var(--jp-layout-color0); color: var(--jp-ui-font-color1); }
.mlms-tl-toolbar { display: flex; gap: 4px; align-items: center; padding: 4px 6px; border-bottom: 1px solid var(--jp-border-color2); }
.mlms-tl-search { width: 220px; }
.mlms-tl-status { margin-left: 8px; color: var(--jp-ui-font-color2); font-size: var(--jp-ui-font-size0); white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.mlms-tl-scroller { position: relative; flex: 1 1 auto; min-height: 160px; overflow-y: auto; overflow-x: hidden; }
.mlms-tl-canvas { display: block; cursor: crosshair; }
.mlms-tl-tooltip { display: none; position: absolute; z-index: 10; pointer-events: none; max-width: 320px;
  background: var(--jp-layout-color1); border: 1px solid var(--jp-border-color1); padding: 4px 6px;
  font-size: var(--jp-ui-font-size0); box-shadow: 0 1px 4px rgba(0, 0, 0, 0.3); word-break: break-all; }
.mlms-tl-details { flex: 0 1 auto; max-height: 40%; overflow-y: auto; padding: 0 8px; font-size: var(--jp-ui-font-size1); }
.mlms-tl-details h4 { margin: 6px 0 2px; }
.mlms-tl-links a { cursor: pointer; text-decoration: underline; }
.mlms-tl-table { border-collapse: collapse; }
.mlms-tl-table th, .mlms-tl-table td { padding: 1px 8px; border-bottom: 1px solid var(--jp-border-color2); text-align: left; }
.mlms-num { text-align: right !important; font-variant-numeric: tabular-nums; }
/* a trace that cannot be read: marked with why (its title), not openable */
.mlms-unreadable { cursor: help; background: var(--jp-error-color3, #ffcdd2); }
`,""]),o.d(e,{},{A:l})},314(r){r.exports=function(r){var e=[];return e.toString=function(){return this.map(function(e){var o="",t=void 0!==e[5];return e[4]&&(o+="@supports (".concat(e[4],") {")),e[2]&&(o+="@media ".concat(e[2]," {")),t&&(o+="@layer".concat(e[5].length>0?" ".concat(e[5]):""," {")),o+=r(e),t&&(o+="}"),e[2]&&(o+="}"),e[4]&&(o+="}"),o}).join("")},e.i=function(r,o,t,n,a){"string"==typeof r&&(r=[[null,r,void 0]]);var l={};if(t)for(var s=0;s<this.length;s++){var i=this[s][0];null!=i&&(l[i]=!0)}for(var p=0;p<r.length;p++){var c=[].concat(r[p]);t&&l[c[0]]||(void 0!==a&&(void 0===c[5]||(c[1]="@layer".concat(c[5].length>0?" ".concat(c[5]):""," {").concat(c[1],"}")),c[5]=a),o&&(c[2]&&(c[1]="@media ".concat(c[2]," {").concat(c[1],"}")),c[2]=o),n&&(c[4]?(c[1]="@supports (".concat(c[4],") {").concat(c[1],"}"),c[4]=n):c[4]="".concat(n)),e.push(c))}},e}},601(r){r.exports=function(r){return r[1]}},72(r){var e=[];function o(r){for(var o=-1,t=0;t<e.length;t++)if(e[t].identifier===r){o=t;break}return o}function t(r,t){for(var n={},a=[],l=0;l<r.length;l++){var s=r[l],i=t.base?s[0]+t.base:s[0],p=n[i]||0,c="".concat(i," ").concat(p);n[i]=p+1;var u=o(c),d={css:s[1],media:s[2],sourceMap:s[3],supports:s[4],layer:s[5]};if(-1!==u)e[u].references++,e[u].updater(d);else{var m=function(r,e){var o=e.domAPI(e);return o.update(r),function(e){e?(e.css!==r.css||e.media!==r.media||e.sourceMap!==r.sourceMap||e.supports!==r.supports||e.layer!==r.layer)&&o.update(r=e):o.remove()}}(d,t);t.byIndex=l,e.splice(l,0,{identifier:c,updater:m,references:1})}a.push(c)}return a}r.exports=function(r,n){var a=t(r=r||[],n=n||{});return function(r){r=r||[];for(var l=0;l<a.length;l++){var s=o(a[l]);e[s].references--}for(var i=t(r,n),p=0;p<a.length;p++){var c=o(a[p]);0===e[c].references&&(e[c].updater(),e.splice(c,1))}a=i}}},659(r){var e={};r.exports=function(r,o){var t=function(r){if(void 0===e[r]){var o=document.querySelector(r);if(window.HTMLIFrameElement&&o instanceof window.HTMLIFrameElement)try{o=o.contentDocument.head}catch(r){o=null}e[r]=o}return e[r]}(r);if(!t)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");t.appendChild(o)}},540(r){r.exports=function(r){var e=document.createElement("style");return r.setAttributes(e,r.attributes),r.insert(e,r.options),e}},56(r,e,o){r.exports=function(r){var e=o.nc;e&&r.setAttribute("nonce",e)}},825(r){r.exports=function(r){if("u"<typeof document)return{update:function(){},remove:function(){}};var e=r.insertStyleElement(r);return{update:function(o){var t,n,a;t="",o.supports&&(t+="@supports (".concat(o.supports,") {")),o.media&&(t+="@media ".concat(o.media," {")),(n=void 0!==o.layer)&&(t+="@layer".concat(o.layer.length>0?" ".concat(o.layer):""," {")),t+=o.css,n&&(t+="}"),o.media&&(t+="}"),o.supports&&(t+="}"),(a=o.sourceMap)&&"u">typeof btoa&&(t+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(a))))," */")),r.styleTagTransform(t,e,r.options)},remove:function(){var r;null===(r=e).parentNode||r.parentNode.removeChild(r)}}}},113(r){r.exports=function(r,e){if(e.styleSheet)e.styleSheet.cssText=r;else{for(;e.firstChild;)e.removeChild(e.firstChild);e.appendChild(document.createTextNode(r))}}},959(r,e,o){var t=o(72),n=o.n(t),a=o(825),l=o.n(a),s=o(659),i=o.n(s),p=o(56),c=o.n(p),u=o(540),d=o.n(u),m=o(113),f=o.n(m),v=o(646),x={};x.styleTagTransform=f(),x.setAttributes=c(),x.insert=i().bind(null,"head"),x.domAPI=l(),x.insertStyleElement=d(),n()(v.A,x),v.A&&v.A.locals&&v.A.locals}}]);